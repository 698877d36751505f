# nxd-train: the training program (train_app/ does the work, command line included: train_app/cli.h).
add_executable(nxd-train nxd_train.cpp)
target_link_libraries(nxd-train PRIVATE nxd_train_app)
nxd_compile_options(nxd-train)
install(TARGETS nxd-train RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
