# nxd-bench-decode-step: one engine step of B decode rows (the serving bench's model, no server):
# per-step wall and CPU time, and a process to attach a profiler to.
add_executable(nxd-bench-decode-step decode_step.cpp)
target_link_libraries(nxd-bench-decode-step PRIVATE nxd_inference)
nxd_compile_options(nxd-bench-decode-step)
if(NXD_BUILD_TESTS)
  add_test(NAME nxd_bench_decode_step_help COMMAND nxd-bench-decode-step --help)
  set_tests_properties(nxd_bench_decode_step_help PROPERTIES LABELS "bench" TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "--context P")
  add_test(NAME nxd_bench_decode_step_bad_rows
           COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=--rows 0: need at least 1"
                   -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
                   $<TARGET_FILE:nxd-bench-decode-step> --rows 0)
  set_tests_properties(nxd_bench_decode_step_bad_rows PROPERTIES LABELS "bench" TIMEOUT 60)
endif()
