# The differentiable nn ops (declared in ops/nn.h), relative to autograd/.
set(NXD_OPS_NN
  ops/softmax.cpp ops/norm.cpp ops/activation.cpp ops/embedding.cpp ops/cross_entropy.cpp
  ops/attention.cpp ops/rotary.cpp ops/dropout.cpp ops/inference.cpp ops/moe.cpp)
