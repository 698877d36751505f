#!/usr/bin/env python3
"""Every published inf2/trn1/trn2 LLM latency row against `nxd-plan --inference`.

Runs nxd-plan once per row (about 0.1-1 s each) and prints the markdown table of
docs/VALIDATION.md ("Inference latency against AWS's published figures"): predicted and
published TTFT and TPOT, and their ratio. Usage:

    python3 bench/inference_validation.py [build/release/tools/nxd-plan]

The rows are the published figures (P50 TTFT and TPOT, ms), copied as numbers; each row's source
is its `src` key, spelled out in SOURCES. Rows with int8 weight storage are left out (the model
charges bf16 weights).
"""
import re
import subprocess
import sys
from collections import namedtuple

Row = namedtuple("Row", "model instance tp batch prompt new ttft tpot sdk src")

SOURCES = {
    "inf2-lat": "aws-neuron-sdk@78169c6c general/benchmarks/inf2/latency_data_decoder.csv "
    "(transformers-neuronx)",
    "trn1-lat": "aws-neuron-sdk@78169c6c general/benchmarks/trn1/latency_data_decoder.csv "
    "(transformers-neuronx)",
    "inf2-thr": "aws-neuron-sdk@78169c6c general/benchmarks/inf2/throughput_data_decoder.csv "
    "(transformers-neuronx)",
    "trn1-thr": "aws-neuron-sdk@78169c6c general/benchmarks/trn1/throughput_data_decoder.csv "
    "(transformers-neuronx)",
    "trn2-70b": "aws-neuron-sdk@ba1c08b0 libraries/nxd-inference/tutorials/llama70b_perf_comparison.csv "
    "(NxD Inference, Llama-3.3-70B, no speculation)",
    "trn2-405b": "aws-neuron-sdk@ba1c08b0 libraries/nxd-inference/tutorials/llama405b_perf_comparison.csv "
    "(NxD Inference, Llama-3.1-405B, no speculation)",
}

# The served max context length of a row where the source gives it (the largest context-encoding
# bucket): the trn2 tutorials compile with --max-context-length 12288 --enable-bucketing, so a
# 10,000-token prompt runs in the 12,288 bucket. The transformers-neuronx rows' prompts are powers
# of two and run in their own bucket.
MAX_CONTEXT = {"trn2-70b": 12288, "trn2-405b": 12288}

# Rows whose prefill runs a flash-attention kernel: the trn2 tutorials' --attn-kernel-enabled (NxD
# Inference's NKI attention). transformers-neuronx (SDK 2.18) builds its prefill attention in HLO
# with the full score matrix (layers/attention.py): nxd-plan's default, materialized.
FLASH = {"trn2-70b", "trn2-405b"}

LLAMA_405B = [
    "model.arch=llama", "model.hidden_size=16384", "model.num_layers=126",
    "model.num_attention_heads=128", "model.num_kv_heads=8", "model.ffn_hidden_size=53248",
    "model.vocab_size=128256", "model.max_position_embeddings=131072", "model.rope_theta=500000",
]

ROWS = [
    Row('llama3-70b', 'inf2.48xlarge', 24, 1, 2048, 2048, 745.49, 34.67, '2.18.1', 'inf2-lat'),
    Row('llama3-70b', 'inf2.48xlarge', 24, 1, 1024, 2048, 312.86, 33.81, '2.18.1', 'inf2-lat'),
    Row('llama3-70b', 'inf2.48xlarge', 24, 1, 1024, 1024, 310.18, 33.14, '2.18.1', 'inf2-lat'),
    Row('llama3-70b', 'inf2.48xlarge', 24, 1, 128, 1024, 80.0, 32.47, '2.18.1', 'inf2-lat'),
    Row('llama3-70b', 'inf2.48xlarge', 24, 1, 256, 256, 99.37, 32.48, '2.18.1', 'inf2-lat'),
    Row('llama3-70b', 'inf2.48xlarge', 24, 1, 128, 128, 77.81, 32.2, '2.18.1', 'inf2-lat'),
    Row('llama2-7b', 'inf2.48xlarge', 24, 1, 128, 3968, 27.64, 6.47, '2.18.0', 'inf2-lat'),
    Row('llama2-7b', 'inf2.48xlarge', 24, 1, 128, 8064, 29.21, 7.34, '2.18.0', 'inf2-lat'),
    Row('llama2-13b', 'inf2.48xlarge', 24, 1, 128, 3968, 25.85, 9.17, '2.18.0', 'inf2-lat'),
    Row('llama2-13b', 'inf2.48xlarge', 24, 1, 4096, 4096, 333.78, 10.17, '2.18.0', 'inf2-lat'),
    Row('llama2-13b', 'inf2.48xlarge', 24, 1, 8192, 8192, 994.18, 13.5, '2.18.0', 'inf2-lat'),
    Row('llama2-70b', 'inf2.48xlarge', 24, 1, 128, 128, 76.6, 32.9, '2.18.0', 'inf2-lat'),
    Row('llama2-70b', 'inf2.48xlarge', 24, 1, 256, 256, 96.44, 33.13, '2.18.0', 'inf2-lat'),
    Row('llama2-70b', 'inf2.48xlarge', 24, 1, 128, 1024, 76.33, 33.15, '2.18.0', 'inf2-lat'),
    Row('llama2-70b', 'inf2.48xlarge', 24, 1, 1024, 1024, 277.02, 33.73, '2.18.0', 'inf2-lat'),
    Row('llama2-70b', 'inf2.48xlarge', 24, 1, 1024, 2048, 275.97, 34.82, '2.18.0', 'inf2-lat'),
    Row('llama2-70b', 'inf2.48xlarge', 24, 1, 2048, 2048, 810.44, 34.9, '2.18.0', 'inf2-lat'),
    Row('mistral-7b', 'inf2.48xlarge', 24, 1, 128, 3968, 27.34, 6.86, '2.18.0', 'inf2-lat'),
    Row('mistral-7b', 'inf2.48xlarge', 24, 1, 4096, 4096, 557.96, 7.87, '2.18.0', 'inf2-lat'),
    Row('mistral-7b', 'inf2.48xlarge', 24, 1, 8192, 8192, 539.59, 10.33, '2.18.0', 'inf2-lat'),
    Row('codellama-13b', 'inf2.48xlarge', 24, 1, 128, 3968, 27.02, 9.12, '2.18.0', 'inf2-lat'),
    Row('codellama-13b', 'inf2.48xlarge', 24, 1, 4096, 4096, 338.67, 10.15, '2.18.0', 'inf2-lat'),
    Row('codellama-13b', 'inf2.48xlarge', 24, 1, 8192, 8192, 989.5, 13.44, '2.18.0', 'inf2-lat'),
    Row('llama3-70b', 'trn1.32xlarge', 32, 1, 2048, 2048, 547.0, 26.2, '2.18.1', 'trn1-lat'),
    Row('llama3-70b', 'trn1.32xlarge', 32, 1, 128, 1024, 53.2, 24.48, '2.18.1', 'trn1-lat'),
    Row('llama3-70b', 'trn1.32xlarge', 32, 1, 128, 128, 52.53, 26.48, '2.18.1', 'trn1-lat'),
    Row('llama2-7b', 'trn1.32xlarge', 32, 1, 128, 8064, 13.32, 6.7, '2.18.0', 'trn1-lat'),
    Row('llama2-13b', 'trn1.32xlarge', 32, 1, 4096, 4096, 864.14, 9.84, '2.18.0', 'trn1-lat'),
    Row('llama2-13b', 'trn1.32xlarge', 32, 1, 8192, 8192, 2367.93, 13.41, '2.18.0', 'trn1-lat'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 1, 128, 128, 53.91, 25.18, '2.18.0', 'trn1-lat'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 1, 256, 256, 81.88, 25.27, '2.18.0', 'trn1-lat'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 1, 128, 1024, 57.75, 25.45, '2.18.0', 'trn1-lat'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 1, 1024, 1024, 232.48, 26.04, '2.18.0', 'trn1-lat'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 1, 1024, 2048, 236.78, 26.62, '2.18.0', 'trn1-lat'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 1, 2048, 2048, 690.96, 26.85, '2.18.0', 'trn1-lat'),
    Row('mistral-7b', 'trn1.32xlarge', 32, 1, 8192, 8192, 1322.87, 9.89, '2.18.0', 'trn1-lat'),
    Row('codellama-13b', 'trn1.32xlarge', 32, 1, 4096, 4096, 868.64, 9.86, '2.18.0', 'trn1-lat'),
    Row('codellama-13b', 'trn1.32xlarge', 32, 1, 8192, 8192, 2372.93, 13.4, '2.18.0', 'trn1-lat'),
    Row('llama2-7b', 'inf2.48xlarge', 24, 8, 128, 3968, 77.36, 12.11, '2.18.0', 'inf2-thr'),
    Row('llama2-7b', 'inf2.48xlarge', 24, 8, 128, 8064, 80.12, 16.39, '2.18.0', 'inf2-thr'),
    Row('llama2-13b', 'inf2.48xlarge', 24, 8, 128, 3968, 108.81, 14.9, '2.18.0', 'inf2-thr'),
    Row('llama2-13b', 'inf2.48xlarge', 24, 8, 4096, 4096, 7083.73, 20.99, '2.18.0', 'inf2-thr'),
    Row('llama2-13b', 'inf2.48xlarge', 24, 4, 8192, 8192, 5141.32, 21.71, '2.18.0', 'inf2-thr'),
    Row('mistral-7b', 'inf2.48xlarge', 24, 8, 128, 3968, 77.62, 11.64, '2.18.0', 'inf2-thr'),
    Row('mistral-7b', 'inf2.48xlarge', 24, 8, 4096, 4096, 4740.12, 16.55, '2.18.0', 'inf2-thr'),
    Row('mistral-7b', 'inf2.48xlarge', 24, 8, 8192, 8192, 11085.12, 18.01, '2.18.0', 'inf2-thr'),
    Row('codellama-13b', 'inf2.48xlarge', 24, 8, 128, 3968, 115.81, 15.87, '2.18.0', 'inf2-thr'),
    Row('codellama-13b', 'inf2.48xlarge', 24, 8, 4096, 4096, 7115.98, 22.27, '2.18.0', 'inf2-thr'),
    Row('codellama-13b', 'inf2.48xlarge', 24, 4, 8192, 8192, 5136.62, 21.67, '2.18.0', 'inf2-thr'),
    Row('llama3-70b', 'trn1.32xlarge', 32, 4, 2048, 2048, 1661.12, 32.33, '2.18.1', 'trn1-thr'),
    Row('llama3-70b', 'trn1.32xlarge', 32, 4, 128, 1024, 129.86, 28.38, '2.18.1', 'trn1-thr'),
    Row('llama3-70b', 'trn1.32xlarge', 32, 4, 128, 128, 130.37, 28.08, '2.18.1', 'trn1-thr'),
    Row('llama2-7b', 'trn1.32xlarge', 32, 8, 128, 8064, 66.4, 10.1, '2.18.0', 'trn1-thr'),
    Row('llama2-13b', 'trn1.32xlarge', 32, 8, 4096, 4096, 6668.7, 19.86, '2.18.0', 'trn1-thr'),
    Row('llama2-13b', 'trn1.32xlarge', 32, 4, 8192, 8192, 4628.45, 21.09, '2.18.0', 'trn1-thr'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 4, 128, 128, 156.85, 26.72, '2.18.0', 'trn1-thr'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 4, 256, 256, 270.16, 26.91, '2.18.0', 'trn1-thr'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 4, 128, 1024, 156.69, 27.21, '2.18.0', 'trn1-thr'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 4, 1024, 1024, 1478.64, 28.55, '2.18.0', 'trn1-thr'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 4, 1024, 2048, 1478.85, 31.67, '2.18.0', 'trn1-thr'),
    Row('llama2-70b', 'trn1.32xlarge', 32, 4, 2048, 2048, 2722.03, 31.79, '2.18.0', 'trn1-thr'),
    Row('mistral-7b', 'trn1.32xlarge', 32, 8, 8192, 8192, 8614.85, 15.44, '2.18.0', 'trn1-thr'),
    Row('codellama-13b', 'trn1.32xlarge', 32, 8, 4096, 4096, 6625.16, 19.92, '2.18.0', 'trn1-thr'),
    Row('codellama-13b', 'trn1.32xlarge', 32, 4, 8192, 8192, 4626.17, 21.1, '2.18.0', 'trn1-thr'),
    Row('llama3-70b', 'trn2.48xlarge', 64, 1, 10000, 1500, 814.2, 19.6, '2.21', 'trn2-70b'),
    Row('llama3.1-405b', 'trn2.48xlarge', 64, 1, 10000, 1500, 2442.0, 37.9, '2.21', 'trn2-405b'),
]


def predict(plan, r):
    args = [plan, "--inference", "--instance", r.instance, "--set",
            f"distributed_strategy.tensor_model_parallel_size={r.tp}", "--batch", str(r.batch),
            "--prompt-tokens", str(r.prompt), "--new-tokens", str(r.new)]
    if r.src in MAX_CONTEXT:
        args += ["--max-context-tokens", str(MAX_CONTEXT[r.src])]
    if r.src in FLASH:
        args += ["--prefill-attention", "flash"]
    if r.model == "llama3.1-405b":
        for k in LLAMA_405B:
            args += ["--set", k]
    else:
        args += ["--model", r.model]
    out = subprocess.run(args, capture_output=True, text=True, check=False).stdout
    m = re.search(r"TTFT ([0-9.]+) ms, TPOT ([0-9.]+) ms", out)
    if not m:
        raise SystemExit(f"no prediction for {r}: {out}")
    return float(m.group(1)), float(m.group(2))


# End-to-end latency per output token (prefill included): the figure the model was first fitted on.
BLOG = Row("llama2-7b", "inf2.xlarge", 2, 1, 256, 256, None, 30.1, "2.13", "blog")
BLOG_SOURCE = ("PyTorch blog 'High-Performance Llama 2 Deployments with AWS Inferentia2 using "
               "TorchServe' (transformers-neuronx): https://pytorch.org/blog/high-performance-llama/")


def main():
    plan = sys.argv[1] if len(sys.argv) > 1 else "build/release/tools/nxd-plan"
    print("| model | instance | TP | batch | in / out | SDK | TTFT pub. | TTFT nxd | ratio "
          "| TPOT pub. | TPOT nxd | ratio | src |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    within = {"ttft": 0, "tpot": 0}
    for r in ROWS:
        ttft, tpot = predict(plan, r)
        rt, rp = ttft / r.ttft, tpot / r.tpot
        within["ttft"] += abs(rt - 1) <= 0.15
        within["tpot"] += abs(rp - 1) <= 0.15
        print(f"| {r.model} | {r.instance} | {r.tp} | {r.batch} | {r.prompt} / {r.new} | {r.sdk} "
              f"| {r.ttft:.1f} | {ttft:.1f} | {rt:.2f} | {r.tpot:.2f} | {tpot:.2f} | {rp:.2f} "
              f"| {r.src} |")
    n = len(ROWS)
    print(f"\nwithin +-15%: TTFT {within['ttft']} of {n}, TPOT {within['tpot']} of {n}")
    ttft, tpot = predict(plan, BLOG)
    e2e = (ttft + (BLOG.new - 1) * tpot) / BLOG.new
    print(f"\n{BLOG.model} {BLOG.instance} TP {BLOG.tp}, {BLOG.prompt} / {BLOG.new}, SDK {BLOG.sdk}: "
          f"end-to-end {e2e:.2f} ms per output token, published {BLOG.tpot} ({e2e / BLOG.tpot:.2f}; "
          f"{BLOG_SOURCE})")


if __name__ == "__main__":
    main()
