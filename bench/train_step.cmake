# nxd-bench-train-step: one training step (forward, backward, AdamW) of a tiny and a GPT-2-124M
# shaped model; baseline: the same step's GEMMs through raw sgemm (the BLAS floor).
add_executable(nxd-bench-train-step train_step.cpp)
target_link_libraries(nxd-bench-train-step PRIVATE nxd_optim nxd_layers)
nxd_compile_options(nxd-bench-train-step)
