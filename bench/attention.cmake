# nxd-bench-attention: fused (FlashAttention-style) causal attention forward + backward vs the
# materialized path, time and peak bytes at S 128/512/2048 and head dim 48/64/128.
add_executable(nxd-bench-attention attention.cpp)
target_link_libraries(nxd-bench-attention PRIVATE nxd_autograd)
nxd_compile_options(nxd-bench-attention)
