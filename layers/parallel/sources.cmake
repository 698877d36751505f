# Tensor/sequence-parallel layers (layers/parallel/): appended to nxd_layers by layers/CMakeLists.txt.
set(NXD_LAYERS_PARALLEL
    parallel/attributes.cpp parallel/mappings.cpp parallel/layers.cpp parallel/qkv.cpp
    parallel/cross_entropy.cpp parallel/pad.cpp parallel/context_parallel.cpp
    parallel/lora.cpp)
