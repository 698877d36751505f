# nxd-bench-serve-engine: where a served request's TTFT goes on the engine alone (the serving
# bench's model): a prefill step against its GEMMs and raw cblas_sgemm on the same shapes, and the
# serving mix replayed in-process for two engine configurations, alternating.
add_executable(nxd-bench-serve-engine serve_engine.cpp)
target_link_libraries(nxd-bench-serve-engine PRIVATE nxd_inference)
nxd_compile_options(nxd-bench-serve-engine)
if(NXD_BUILD_TESTS)
  add_test(NAME nxd_bench_serve_engine_help COMMAND nxd-bench-serve-engine --help)
  set_tests_properties(nxd_bench_serve_engine_help PROPERTIES LABELS "bench" TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "--requests-per-client R")
  add_test(NAME nxd_bench_serve_engine_bad_option
           COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=option 'prefill_calls=x'"
                   -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
                   $<TARGET_FILE:nxd-bench-serve-engine> --a prefill_calls=x)
  set_tests_properties(nxd_bench_serve_engine_bad_option PROPERTIES LABELS "bench" TIMEOUT 60)
endif()
