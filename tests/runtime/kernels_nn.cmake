# Tests of the neural-network kernels (fast kernel vs its naive reference, meta shapes, errors).
set(NXD_TESTS_KERNELS_NN
  kernels/nn_softmax_norm_test.cpp kernels/nn_activation_test.cpp
  kernels/nn_embedding_ce_test.cpp kernels/nn_attention_test.cpp
  kernels/nn_flash_attention_test.cpp kernels/nn_sliding_window_test.cpp
  kernels/nn_rotary_dropout_test.cpp
  # the same bits at every address of every operand
  kernels/address_test.cpp
  # bitwise equality at 1 and 2 threads of every kernel that runs on the compute pool
  kernels/threads_test.cpp)
