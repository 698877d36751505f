# nxd-bench-train-step: one training step (forward, backward, AdamW) of a tiny and a GPT-2-124M
# shaped model; baseline: the same step's GEMMs through raw sgemm (the BLAS floor).
add_executable(nxd-bench-train-step train_step.cpp)
target_link_libraries(nxd-bench-train-step PRIVATE nxd_optim nxd_layers)
nxd_compile_options(nxd-bench-train-step)
# nxd-bench-train-parallel: nxd-train's loop at TP=2, DP=2, TP=2 x DP=2 on the sim backend
# against one rank with the same global batch (host tokens/s ratio, modeled step time).
add_executable(nxd-bench-train-parallel train_parallel.cpp)
target_link_libraries(nxd-bench-train-parallel PRIVATE nxd_train_app)
nxd_compile_options(nxd-bench-train-parallel)
