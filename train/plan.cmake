# The memory plan on meta tensors (plan.h): nxd-train's check before it allocates, and nxd-plan's.
target_sources(nxd_train PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/plan.cpp)
target_sources(nxd_train PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/plan_step.cpp)
target_sources(nxd_train PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/plan_state.cpp)
