# nxd-bench-trace: traced decoder vs eager KV-cache path, trace load vs raw read, bucket padding.
add_executable(nxd-bench-trace trace.cpp)
target_link_libraries(nxd-bench-trace PRIVATE nxd_trace)
nxd_compile_options(nxd-bench-trace)
