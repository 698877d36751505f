# nxd-ckpt: inspect, verify, export and reshard checkpoints (checkpoint/ does the work).
add_executable(nxd-ckpt nxd_ckpt.cpp)
target_link_libraries(nxd-ckpt PRIVATE nxd_checkpoint nxd_cli)
nxd_compile_options(nxd-ckpt)
install(TARGETS nxd-ckpt RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
