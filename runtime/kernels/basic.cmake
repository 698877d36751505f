# The basic kernels: matmul (BLAS), elementwise with broadcasting, reductions.
set(NXD_KERNELS_BASIC kernels/matmul.cpp kernels/gemv_bf16.cpp kernels/gemv_int8.cpp kernels/gemv_int4.cpp
    kernels/elementwise.cpp kernels/reduce.cpp)
# Lets sqrt and friends vectorize (no errno side effects); results are unchanged.
set_source_files_properties(kernels/elementwise.cpp kernels/reduce.cpp kernels/gemv_bf16.cpp kernels/gemv_int8.cpp kernels/gemv_int4.cpp PROPERTIES COMPILE_OPTIONS
                            "-fno-math-errno")
