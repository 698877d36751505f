# nxd-bench-context-parallel: context parallelism's activation peak (allocator) and modeled step
# time at CP 1/2/4 on meta tensors at a long sequence, and a sequence one rank cannot hold trained
# at CP 2 under a capped device memory.
add_executable(nxd-bench-context-parallel context_parallel.cpp)
target_link_libraries(nxd-bench-context-parallel PRIVATE nxd_optim)
nxd_compile_options(nxd-bench-context-parallel)
