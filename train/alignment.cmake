# Fine-tuning (SFT with packing, DPO) from jsonl: alignment_data.h, alignment_config.cpp,
# dpo_module.h.
target_sources(nxd_train PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/alignment_data.cpp)
target_sources(nxd_train PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/alignment_config.cpp)
target_sources(nxd_train PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/dpo_module.cpp)
