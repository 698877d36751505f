# nxd-bench-matmul: the engine's matmul/linear forward and backward products vs raw cblas_sgemm.
add_executable(nxd-bench-matmul matmul.cpp)
target_link_libraries(nxd-bench-matmul PRIVATE nxd_autograd)
nxd_compile_options(nxd-bench-matmul)
# Flags: --help prints them and exits 0; an unknown flag or a value outside a flag's choices
# exits 2 naming it, before anything is timed.
if(NXD_BUILD_TESTS)
  add_test(NAME nxd_bench_matmul_help COMMAND nxd-bench-matmul --help)
  set_tests_properties(nxd_bench_matmul_help PROPERTIES LABELS "bench" TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "--bf16-kernel K.*\\(amx, avx512_bf16, portable\\)")
  add_test(NAME nxd_bench_matmul_unknown_flag
           COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=unknown flag --bogus \\(see nxd-bench-matmul --help\\)"
                   -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
                   $<TARGET_FILE:nxd-bench-matmul> --threads 1 --bogus)
  add_test(NAME nxd_bench_matmul_bad_value
           COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=--threads two: expected an integer"
                   -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
                   $<TARGET_FILE:nxd-bench-matmul> --threads two)
  set_tests_properties(nxd_bench_matmul_unknown_flag nxd_bench_matmul_bad_value PROPERTIES
                       LABELS "bench" TIMEOUT 60)
endif()
