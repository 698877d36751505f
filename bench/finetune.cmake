# nxd-bench-finetune: LoRA vs full fine-tuning (step time, memory per rank) at TP 1 and 2, and
# SFT packing vs padding (real tokens/s over one epoch of a log-uniform length mix).
add_executable(nxd-bench-finetune finetune.cpp)
target_link_libraries(nxd-bench-finetune PRIVATE nxd_train_app)
nxd_compile_options(nxd-bench-finetune)
