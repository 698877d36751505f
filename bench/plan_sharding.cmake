# nxd-bench-plan-sharding: the largest Llama that fits per sharding level (ZeRO 0/1/2, offload)
# on 1, 4 and 16 trn1 and trn2 nodes, by nxd-plan's planner; and a 1,024-rank plan's wall time
# and peak RSS.
add_executable(nxd-bench-plan-sharding plan_sharding.cpp)
target_link_libraries(nxd-bench-plan-sharding PRIVATE nxd_train_app nxd_cli)
nxd_compile_options(nxd-bench-plan-sharding)
