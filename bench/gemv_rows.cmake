# nxd-bench-gemv-rows: the f32 decode-step products at 1-32 rows (one per running sequence:
# runtime/gemv_f32.cpp) against raw cblas_sgemm on a 125M Llama's shapes.
add_executable(nxd-bench-gemv-rows gemv_rows.cpp)
target_link_libraries(nxd-bench-gemv-rows PRIVATE nxd_runtime)
nxd_compile_options(nxd-bench-gemv-rows)
if(NXD_BUILD_TESTS)
  add_test(NAME nxd_bench_gemv_rows_help COMMAND nxd-bench-gemv-rows --help)
  set_tests_properties(nxd_bench_gemv_rows_help PROPERTIES LABELS "bench" TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "--rows LIST")
  add_test(NAME nxd_bench_gemv_rows_bad_rows
           COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=--rows 4,x: expected integers"
                   -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
                   $<TARGET_FILE:nxd-bench-gemv-rows> --rows 4,x)
  set_tests_properties(nxd_bench_gemv_rows_bad_rows PROPERTIES LABELS "bench" TIMEOUT 60)
endif()
# nxd-bench-gemv-bf16-rows: the bf16 decode-step products at 1-32 rows (runtime/kernels/
# gemv_bf16.cpp) against the bf16 block path and raw f32 cblas_sgemm on the same shapes.
add_executable(nxd-bench-gemv-bf16-rows gemv_bf16_rows.cpp)
target_link_libraries(nxd-bench-gemv-bf16-rows PRIVATE nxd_runtime)
nxd_compile_options(nxd-bench-gemv-bf16-rows)
if(NXD_BUILD_TESTS)
  add_test(NAME nxd_bench_gemv_bf16_rows_bad_rows
           COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=--rows 8,33: expected integers 1..32"
                   -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
                   $<TARGET_FILE:nxd-bench-gemv-bf16-rows> --rows 8,33)
  set_tests_properties(nxd_bench_gemv_bf16_rows_bad_rows PROPERTIES LABELS "bench" TIMEOUT 60)
endif()
