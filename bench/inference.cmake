# nxd-bench-inference: prefill and decode with the KV cache on a ~125M Llama (fp32/bf16, 1-2
# threads), the decode roofline fraction, TP 2 vs TP 1; bench/generate_torch.py is its PyTorch
# baseline (same model and weights).
add_executable(nxd-bench-inference inference.cpp)
target_link_libraries(nxd-bench-inference PRIVATE nxd_trace nxd_checkpoint)
nxd_compile_options(nxd-bench-inference)
