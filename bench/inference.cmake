# nxd-bench-inference: prefill and decode with the KV cache on a ~125M Llama (fp32/bf16/int8/int4, 1-2
# threads), the decode roofline fraction, TP 2 vs TP 1; bench/generate_torch.py is its PyTorch
# baseline (same model and weights).
add_executable(nxd-bench-inference inference.cpp)
target_link_libraries(nxd-bench-inference PRIVATE nxd_trace nxd_checkpoint)
nxd_compile_options(nxd-bench-inference)
if(NXD_BUILD_TESTS)
  add_test(NAME nxd_bench_inference_help COMMAND nxd-bench-inference --help)
  set_tests_properties(nxd_bench_inference_help PROPERTIES LABELS "bench" TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "--precision P.*\\(fp32, bf16, int8, int4, int4q8\\)")
  # fp16 used to run fp32 labelled fp16
  add_test(NAME nxd_bench_inference_fp16_refused
           COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=--precision fp16: expected one of fp32, bf16"
                   -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
                   $<TARGET_FILE:nxd-bench-inference> --precision fp16)
  set_tests_properties(nxd_bench_inference_fp16_refused PROPERTIES LABELS "bench" TIMEOUT 60)
endif()
