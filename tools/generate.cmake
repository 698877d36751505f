# nxd-generate: text from a checkpoint or a transformers folder with the KV cache.
add_executable(nxd-generate nxd_generate.cpp)
# nxd_train for the tokenizer (train/tokenizer.h); listed first: it sits above nxd_trace
target_link_libraries(nxd-generate PRIVATE nxd_train nxd_trace nxd_checkpoint)
nxd_compile_options(nxd-generate)
install(TARGETS nxd-generate RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
