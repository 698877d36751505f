#!/usr/bin/env python3
"""The PyTorch baseline of bench/train_step.cpp: the same two training steps (forward, loss,
backward, grad-norm clip, AdamW) with a plain GPT module, then nxd's bench, and the ratio.

    python3 bench/train_step_torch.py [--nxd build/release/bench/nxd-bench-train-step] [--threads 2]
                                      [--precision fp32|bf16] [--case tiny|gpt2|all]

--precision bf16 compares like with like: nxd's bf16 matmul precision (f32 tensors, GEMM inputs
rounded to bf16, f32 accumulation) against PyTorch's CPU autocast to bf16 (torch.autocast("cpu",
dtype=torch.bfloat16) around forward and loss; master weights and AdamW stay f32).

Needs Debian's python3-torch; without it the script says so and exits 0. Runs with
OMP_WAIT_POLICY=PASSIVE (spinning OpenMP threads next to OpenBLAS's pool made 2 threads slower
than 1 on the reference machine).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

CASES = {
    # name: vocab, layers, heads, hidden, batch, seq
    "tiny": (256, 4, 4, 256, 8, 128),
    "gpt2": (50257, 12, 12, 768, 4, 64),
}


def torch_step_ms(torch, case, threads, reps, precision):
    import torch.nn as nn
    import torch.nn.functional as F

    vocab, layers, heads, hidden, batch, seq = CASES[case]
    torch.set_num_threads(threads)
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-1, -2)) / (h // heads) ** 0.5
            att = att.masked_fill(~self.mask[:s, :s], float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, h))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(hidden)

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            return self.ln(x) @ self.wte.weight.t()

    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids = torch.randint(0, vocab, (batch, seq))
    tgt = torch.randint(0, vocab, (batch, seq))

    def step():
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(ids).view(-1, vocab).float(), tgt.view(-1))
        else:
            loss = F.cross_entropy(model(ids).view(-1, vocab), tgt.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nxd", default="build/release/bench/nxd-bench-train-step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--case", choices=["tiny", "gpt2", "all"], default="all")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("# python3-torch is not installed: no PyTorch baseline (apt install python3-torch)")
        return 0
    nxd = {}
    if os.path.exists(a.nxd):
        out = subprocess.run([a.nxd, "--threads", str(a.threads), "--reps", str(a.reps),
                              "--precision", a.precision, "--case", a.case],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            m = re.match(r"case=(\w+) .*ms_per_step=([\d.]+)", line)
            if m:
                nxd[m.group(1)] = float(m.group(2))
    else:
        print(f"# {a.nxd} not found: PyTorch only")
    for case in CASES:
        if a.case not in ("all", case):
            continue
        ms = torch_step_ms(torch, case, a.threads, a.reps, a.precision)
        tokens = CASES[case][4] * CASES[case][5]
        line = f"case={case} threads={a.threads} precision={a.precision} torch_ms={ms:.1f} torch_tokens_per_s={tokens / ms * 1e3:.0f}"
        if case in nxd:
            line += f" nxd_ms={nxd[case]:.1f} speedup={ms / nxd[case]:.2f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
