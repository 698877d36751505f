# nxd-elastic: nxd-train under mpirun, relaunched on what is left when a rank or a host dies.
add_executable(nxd-elastic nxd_elastic.cpp elastic/plan.cpp elastic/launch.cpp
                           elastic/supervisor.cpp)
target_include_directories(nxd-elastic PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(nxd-elastic PRIVATE nxd_train_app)
nxd_compile_options(nxd-elastic)
install(TARGETS nxd-elastic RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
