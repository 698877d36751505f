# nxd-generate: text from a checkpoint or a transformers folder with the KV cache.
add_executable(nxd-generate nxd_generate.cpp generate_cli.cpp generate_quality.cpp)
# the tokenizer and transformers folders from nxd_io; checkpoints from nxd_checkpoint
target_link_libraries(nxd-generate PRIVATE nxd_trace nxd_checkpoint nxd_io nxd_cli)
nxd_compile_options(nxd-generate)
install(TARGETS nxd-generate RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
