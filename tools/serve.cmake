# nxd-serve: the OpenAI-compatible HTTP server over the inference engine.
add_executable(nxd-serve nxd_serve.cpp)
target_link_libraries(nxd-serve PRIVATE nxd_inference_server nxd_checkpoint nxd_io)
nxd_compile_options(nxd-serve)
install(TARGETS nxd-serve RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
