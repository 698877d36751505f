# Neural-network kernels (softmax, norms, activations, embedding, cross-entropy, attention,
# rotary, dropout), relative to runtime/.
set(NXD_KERNELS_NN
  kernels/softmax.cpp kernels/norm.cpp kernels/activation.cpp kernels/embedding.cpp
  kernels/cross_entropy.cpp kernels/attention.cpp kernels/flash_attention.cpp kernels/rotary.cpp
  kernels/dropout.cpp kernels/kv_cache.cpp)
