# nxd-bench-optimizer: ZeRO-1 at DP 1-8 and precision.type fp32/autocast/mixed_precision/bf16SR
# through nxd-train's loop on the sim backend (optimizer state per rank, HBM and activation peaks,
# host tokens/s, modeled step time; baselines DP 1 without ZeRO-1 and fp32).
add_executable(nxd-bench-optimizer optimizer.cpp)
target_link_libraries(nxd-bench-optimizer PRIVATE nxd_train_app)
nxd_compile_options(nxd-bench-optimizer)
