# nxd-train: the training program (train/ does the work, command line included: train/cli.h).
add_executable(nxd-train nxd_train.cpp)
target_link_libraries(nxd-train PRIVATE nxd_train)
nxd_compile_options(nxd-train)
install(TARGETS nxd-train RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
