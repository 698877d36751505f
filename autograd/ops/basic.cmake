# The basic differentiable ops: elementwise, reductions, matmul/linear, shape ops.
set(NXD_OPS_BASIC ops/elementwise.cpp ops/reduce.cpp ops/matmul.cpp ops/shape.cpp)
