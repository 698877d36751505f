# nxd-bench-serve: nxd-serve against llama-server on the same weights (issue 36): throughput,
# TTFT and ITL at 1-64 concurrent streaming clients, prefix caching, chunked prefill.
# bench/llamacpp/compare_serve.py prepares the model, its GGUF export and llama.cpp, then runs it.
add_executable(nxd-bench-serve serve.cpp serve_cases.cpp serve_client.cpp serve_process.cpp)
target_link_libraries(nxd-bench-serve PRIVATE nxd_cli nxd_io PkgConfig::HTTPLIB Threads::Threads)
nxd_compile_options(nxd-bench-serve)
if(NXD_BUILD_TESTS)
  # The smoke run against nxd-serve alone (no llama.cpp): a tiny model exported by
  # nxd-bench-inference (fixture), every case shrunk by --smoke.
  set(_serve_smoke_dir ${CMAKE_CURRENT_BINARY_DIR}/serve_smoke)
  add_test(NAME nxd_bench_serve_model
           COMMAND nxd-bench-inference --model tiny --export ${_serve_smoke_dir}/model)
  set_tests_properties(nxd_bench_serve_model PROPERTIES LABELS "bench" TIMEOUT 60
                       FIXTURES_SETUP nxd_bench_serve_model)
  add_test(NAME nxd_bench_serve_smoke
           COMMAND nxd-bench-serve --smoke --no-llamacpp --threads 1 --hf ${_serve_smoke_dir}/model
                   --nxd-serve $<TARGET_FILE:nxd-serve> --work ${_serve_smoke_dir}/work)
  set_tests_properties(nxd_bench_serve_smoke PROPERTIES LABELS "bench" TIMEOUT 120
                       FIXTURES_REQUIRED nxd_bench_serve_model
                       PASS_REGULAR_EXPRESSION "case=chunked_prefill_ratio")
  add_test(NAME nxd_bench_serve_needs_hf
           COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=--hf DIR is required"
                   -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
                   $<TARGET_FILE:nxd-bench-serve> --no-llamacpp)
  set_tests_properties(nxd_bench_serve_needs_hf PROPERTIES LABELS "bench" TIMEOUT 60)
endif()
