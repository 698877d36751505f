# nxd-bench-collectives: nccl-tests-style collective benchmark on the sim or MPI backend.
add_executable(nxd-bench-collectives nxd_bench_collectives.cpp)
target_link_libraries(nxd-bench-collectives PRIVATE nxd_collectives)
nxd_compile_options(nxd-bench-collectives)
install(TARGETS nxd-bench-collectives RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
