# nxd-plan: one training step on meta tensors over the sim backend (train_app/plan.h): memory per
# NeuronCore, the modeled step and predicted throughput; --search over layouts.
add_executable(nxd-plan nxd_plan.cpp nxd_plan_search.cpp nxd_plan_inference.cpp)
target_link_libraries(nxd-plan PRIVATE nxd_train_app)
nxd_compile_options(nxd-plan)
install(TARGETS nxd-plan RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
