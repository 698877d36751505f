#!/usr/bin/env python3
"""The PyTorch baseline of bench/inference.cpp: the same ~125M Llama (GQA) with the same weights
(nxd-bench-inference --export), generation with a KV cache written in plain torch under
torch.inference_mode: the prefill of a 128-token prompt and one decode step at cache position 128,
fp32 and bf16, 1 and 2 threads; then nxd's bench on the same cases, and the ratios:

    /usr/bin/python3 bench/generate_torch.py [--nxd build/release/bench/nxd-bench-inference]
                                             [--threads 1,2] [--precision fp32,bf16] [--reps 5]

One line per case: case=decode|prefill threads=T precision=P torch_tok_s=.. nxd_tok_s=.. speedup=..
(nxd's roofline_fraction on the decode lines), then nxd's TP 2 (two sim ranks, one core each) vs
TP 1 line. It first checks that both give the same prefill logits (logits_max_abs_diff=).

Needs Debian's python3-torch (/usr/bin/python3); without it the script says so and exits 0.
Runs with OMP_WAIT_POLICY=PASSIVE.
"""
import argparse
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def read_safetensors(torch, path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        a, b = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(e["shape"])
    return out


class Llama:
    """HF Llama math with a preallocated KV cache [1, kv_heads, max_len, head_dim] per layer."""

    def __init__(self, torch, cfg, w, dtype, max_len):
        self.t = torch
        self.cfg = cfg
        self.w = {k: v.to(dtype) for k, v in w.items()}
        self.h = cfg["num_attention_heads"]
        self.kvh = cfg["num_key_value_heads"]
        self.d = cfg["hidden_size"] // self.h
        self.eps = cfg["rms_norm_eps"]
        self.L = cfg["num_hidden_layers"]
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, self.d, 2, dtype=torch.float32) / self.d))
        ang = torch.arange(max_len, dtype=torch.float32)[:, None] * inv[None, :]
        self.cos, self.sin = ang.cos().to(dtype), ang.sin().to(dtype)
        self.k = [torch.zeros(1, self.kvh, max_len, self.d, dtype=dtype) for _ in range(self.L)]
        self.v = [torch.zeros(1, self.kvh, max_len, self.d, dtype=dtype) for _ in range(self.L)]

    def norm(self, x, w):
        t = self.t
        xf = x.float()
        return (xf * t.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    def rope(self, x, pos):
        c = self.t.cat([self.cos[pos], self.cos[pos]], -1)
        s = self.t.cat([self.sin[pos], self.sin[pos]], -1)
        half = x.shape[-1] // 2
        rot = self.t.cat([-x[..., half:], x[..., :half]], -1)
        return x * c + rot * s

    def forward(self, ids, start):
        t, F = self.t, self.t.nn.functional
        w = self.w
        S = ids.shape[1]
        pos = t.arange(start, start + S)
        x = w["model.embed_tokens.weight"][ids]
        g = self.h // self.kvh
        for i in range(self.L):
            p = f"model.layers.{i}."
            n = self.norm(x, w[p + "input_layernorm.weight"])
            q = F.linear(n, w[p + "self_attn.q_proj.weight"]).view(1, S, self.h, self.d).transpose(1, 2)
            k = F.linear(n, w[p + "self_attn.k_proj.weight"]).view(1, S, self.kvh, self.d).transpose(1, 2)
            v = F.linear(n, w[p + "self_attn.v_proj.weight"]).view(1, S, self.kvh, self.d).transpose(1, 2)
            q, k = self.rope(q, pos), self.rope(k, pos)
            self.k[i][:, :, start:start + S] = k
            self.v[i][:, :, start:start + S] = v
            kc = self.k[i][:, :, :start + S].repeat_interleave(g, 1)
            vc = self.v[i][:, :, :start + S].repeat_interleave(g, 1)
            s = (q @ kc.transpose(-1, -2)) / (self.d ** 0.5)
            if S > 1:
                mask = t.ones(S, start + S, dtype=t.bool).tril(start)
                s = s.masked_fill(~mask, float("-inf"))
            o = (s.float().softmax(-1).to(q.dtype) @ vc).transpose(1, 2).reshape(1, S, -1)
            x = x + F.linear(o, w[p + "self_attn.o_proj.weight"])
            n = self.norm(x, w[p + "post_attention_layernorm.weight"])
            m = F.silu(F.linear(n, w[p + "mlp.gate_proj.weight"])) * F.linear(n, w[p + "mlp.up_proj.weight"])
            x = x + F.linear(m, w[p + "mlp.down_proj.weight"])
        x = self.norm(x[:, -1], w["model.norm.weight"])
        return F.linear(x, w["lm_head.weight"])


def median_time(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        s = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - s)
    return statistics.median(ts)


def parse(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nxd", default="build/release/bench/nxd-bench-inference")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--precision", default="fp32,bf16")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("generate_torch.py: PyTorch is not installed (Debian: python3-torch); nothing to compare")
        return 0
    P = 128
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([a.nxd, "--export", d], check=True, stdout=subprocess.DEVNULL)
        cfg = json.load(open(os.path.join(d, "config.json")))
        w = read_safetensors(torch, os.path.join(d, "model.safetensors"))
        ref = torch.frombuffer(bytearray(open(os.path.join(d, "prefill_logits.f32"), "rb").read()),
                               dtype=torch.float32)
    ids = torch.tensor([[(i * 7919 + 13) % cfg["vocab_size"] for i in range(P)]])
    with torch.inference_mode():
        m = Llama(torch, cfg, w, torch.float32, P + 1)
        diff = (m.forward(ids, 0)[0] - ref).abs().max().item()
    print(f"model: llama {sum(v.numel() for v in w.values())} parameters; "
          f"torch {torch.__version__}; logits_max_abs_diff={diff:.3g}")
    for prec in a.precision.split(","):
        dtype = torch.bfloat16 if prec == "bf16" else torch.float32
        for threads in [int(x) for x in a.threads.split(",")]:
            torch.set_num_threads(threads)
            with torch.inference_mode():
                m = Llama(torch, cfg, w, dtype, P + 1)
                pre = median_time(lambda: m.forward(ids, 0), a.reps)
                tok = ids[:, :1]
                dec = median_time(lambda: m.forward(tok, P), 4 * a.reps, warmup=3)
            out = subprocess.run([a.nxd, "--threads", str(threads), "--precision", prec,
                                  "--reps", str(a.reps)], check=True, capture_output=True,
                                 text=True).stdout
            nx = {parse(l)["case"]: parse(l) for l in out.splitlines() if l.startswith("case=")}
            for case, t in (("prefill", pre), ("decode", dec)):
                ttok = (P if case == "prefill" else 1) / t
                ntok = float(nx[case]["nxd_tok_s"])
                extra = f" roofline_fraction={nx[case]['roofline_fraction']}" if case == "decode" else ""
                print(f"case={case} threads={threads} precision={prec} torch_tok_s={ttok:.1f} "
                      f"nxd_tok_s={ntok:.1f} speedup={ntok / ttok:.2f}{extra}", flush=True)
    for prec in a.precision.split(","):
        out = subprocess.run([a.nxd, "--tp-compare", "--precision", prec, "--reps", str(a.reps)],
                             check=True, capture_output=True, text=True).stdout
        print(out.strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
