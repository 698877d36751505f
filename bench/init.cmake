# nxd-bench-init: a 7B Llama shape built on the meta device at TP 8 and one rank's shard
# materialized (by each parameter's registered rule); baseline: a memset of the same bytes.
add_executable(nxd-bench-init init.cpp)
target_link_libraries(nxd-bench-init PRIVATE nxd_layers)
nxd_compile_options(nxd-bench-init)
