# nxd-bench-collectives: nccl-tests-style collective benchmark on the sim or MPI backend.
add_executable(nxd-bench-collectives collectives.cpp collectives_mpi.cpp)
target_link_libraries(nxd-bench-collectives PRIVATE nxd_collectives)
nxd_compile_options(nxd-bench-collectives)
install(TARGETS nxd-bench-collectives RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(NXD_BUILD_TESTS)
  # nxd-bench-collectives: a tiny sim run, and a bad flag (message + usage, exit code 2).
  add_test(NAME nxd_bench_collectives_smoke
           COMMAND nxd-bench-collectives --backend sim --op all_reduce --ranks 2 --min 8 --max 64K
                   --iters 2)
  set_tests_properties(nxd_bench_collectives_smoke PROPERTIES LABELS "collectives" TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "65536 +16384 +f32")
  add_test(NAME nxd_bench_collectives_bad_flag
           COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=unknown --op 'nope'.*usage: nxd-bench-collectives"
                   -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
                   $<TARGET_FILE:nxd-bench-collectives> --op nope)
  set_tests_properties(nxd_bench_collectives_bad_flag PROPERTIES LABELS "collectives" TIMEOUT 60)
  # Built without MPI, --backend mpi is a user error: exit code 2 and a message that says why.
  if(NOT NXD_WITH_MPI)
    add_test(NAME nxd_bench_collectives_no_mpi
             COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=--backend mpi: nxd was built without MPI"
                     -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
                     $<TARGET_FILE:nxd-bench-collectives> --backend mpi)
    set_tests_properties(nxd_bench_collectives_no_mpi PROPERTIES LABELS "collectives" TIMEOUT 60)
  endif()
endif()
