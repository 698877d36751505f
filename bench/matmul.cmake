# nxd-bench-matmul: the engine's matmul/linear forward and backward products vs raw cblas_sgemm.
add_executable(nxd-bench-matmul matmul.cpp)
target_link_libraries(nxd-bench-matmul PRIVATE nxd_autograd)
nxd_compile_options(nxd-bench-matmul)
