# nxd-bench-checkpoint: checkpoint save/load GB/s (plain, zstd, async) against raw write/read.
add_executable(nxd-bench-checkpoint checkpoint.cpp)
target_link_libraries(nxd-bench-checkpoint PRIVATE nxd_checkpoint)
nxd_compile_options(nxd-bench-checkpoint)
