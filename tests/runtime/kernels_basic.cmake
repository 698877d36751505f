# Tests of the basic kernels (matmul, elementwise, reductions).
set(NXD_TESTS_KERNELS_BASIC kernels/matmul_test.cpp kernels/elementwise_test.cpp
                            kernels/reduce_test.cpp kernels/gemv_int8_test.cpp
                            kernels/gemv_int4_test.cpp)
