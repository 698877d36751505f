# Tests of the basic differentiable ops (elementwise, reductions, matmul/linear, shape ops).
set(NXD_TESTS_OPS_BASIC ops/elementwise_test.cpp ops/reduce_test.cpp ops/matmul_test.cpp
                        ops/shape_test.cpp)
