# nxd-bench-gemv-quant: the int8 / int4 / f32 decode GEMVs (m = 1) on a 125M Llama's shapes
# against memcpy of the same weight bytes.
add_executable(nxd-bench-gemv-quant gemv_quant.cpp)
target_link_libraries(nxd-bench-gemv-quant PRIVATE nxd_runtime)
nxd_compile_options(nxd-bench-gemv-quant)
if(NXD_BUILD_TESTS)
  add_test(NAME nxd_bench_gemv_quant_help COMMAND nxd-bench-gemv-quant --help)
  set_tests_properties(nxd_bench_gemv_quant_help PROPERTIES LABELS "bench" TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "--threads N")
endif()
