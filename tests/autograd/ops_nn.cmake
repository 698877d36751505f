# Tests of the differentiable nn ops (forward vs naive reference, gradcheck, errors, meta).
set(NXD_TESTS_OPS_NN ops/nn_softmax_norm_test.cpp ops/nn_activation_embedding_test.cpp
                     ops/nn_cross_entropy_test.cpp ops/nn_attention_rotary_dropout_test.cpp
                     ops/nn_flash_attention_test.cpp
                     ops/nn_document_attention_test.cpp)
