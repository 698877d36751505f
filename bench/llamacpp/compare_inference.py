#!/usr/bin/python3
"""nxd against llama.cpp on the same weights: prefill and decode tokens/s (issue 37).

  /usr/bin/python3 bench/llamacpp/compare_inference.py [--nxd-build build/release]
      [--work DIR] [--threads 1,2] [--precisions fp32,bf16,int8,int4[,int4q8]] [--reps 5]
      [--prompt 128] [--gen 32] [--speculative] [--smoke] [--quantize-head none|int8|int4]

1. The model: nxd-bench-inference --export (the ~125M bench Llama with its seeded weights, a
   synthetic byte-level tokenizer of its 32000 ids, and its own prompt logits), imported as an nxd
   checkpoint (nxd-ckpt import-hf) and exported with nxd-ckpt export-gguf at f32, bf16, q8_0, q4_0.
2. Agreement before any timing: the last position's logits of the bench prompt (128 ids) under
   llama.cpp (llamacpp_logits.cpp, built here against the same libllama, f32 KV cache, flash
   attention off) against nxd's on the same GGUF file's weights (nxd-bench-inference
   --logits-gguf: the file read as f32). Relative difference = max |a - b| / max |b|. Limits: f32
   1e-3 (both sides compute in f32; what is left is summation order: 1.2e-6 on the bench model);
   bf16, q8_0, q4_0 5e-2 (llama.cpp also rounds the activations entering each matrix product to
   bf16 or to q8_0 blocks, nxd keeps them f32: 4.2e-3, 1.5e-2 and 1.7e-2 on the bench model; a
   wrong layout, such as an unpermuted rotary row, is of order 1). Any case over its limit: exit
   1, nothing timed.
3. For each thread count and precision (fp32<->F32, bf16<->BF16, int8<->Q8_0, int4<->Q4_0; nxd's
   int4 is symmetric in groups of 32 as Q4_0; int4q8, against the same Q4_0 file, is nxd's int4 with
   its activations in int8 per 32-input block as llama.cpp's Q8_0 x Q4_0 products): llama-bench -p P -n 0 (prefill) and -p 0 -n G -d P
   (decode of G tokens after a P-token context: positions P..P+G-1), -r reps, medians of its
   samples; nxd-bench-inference --precision ... --prompt P --reps reps --no-traced (prefill median
   of reps, decode median of 4*reps steps at position P). KV cache: llama-bench f16 (it offers no
   f32 cache), bf16 for bf16; nxd f32, bf16 for bf16 (at a 128-token context the K/V are 0.75%
   of an f32 step's bytes, 5% of a q4_0 step's); llama-bench's flash attention is left at its
   default (auto: on for the CPU). One line per case:
     case=prefill|decode threads=T precision=P llamacpp_tok_s= nxd_tok_s= ratio=(nxd/llama.cpp)
     bytes_per_token= llamacpp_bytes_per_token= roofline_fraction= llamacpp_roofline_fraction=
   bytes_per_token: what one token must read (decode: every weight but the embedding table, one
   embedding row, the K/V of the context; prefill: the weights over P); roofline_fraction: the
   time to stream that many bytes (nxd-bench-inference's stream measurement at the same threads)
   over the time per token. nxd's int8/int4 keep the output head f32 unless --quantize-head int8
   or int4 (nxd-bench-inference --head); the Q8_0/Q4_0 files hold it quantized, so without it the
   two sides read different bytes (both columns are printed).
4. --speculative: nxd-generate --eager on the bench model with and without a draft (the bench's
   --model draft: 4 layers, hidden 256, same vocabulary) at --speculate 2, 4, 8: generated tokens
   over the whole generation's time (prefill included: speculative decoding's report counts it
   inside its decode line), the ratio to plain decoding and the acceptance rate. Both models are
   random, so acceptance is low: the figure is the overhead of a round, not a speed-up a trained
   pair would show.
The CPU model, its vector ISA flags and the load average are printed at the start and the end.
--smoke: the tiny model, 1 thread, 1 repetition, 16-token prompt, 4 tokens (seconds, checks the
pipeline). llama.cpp: NXD_LLAMACPP_BUILD=DIR reuses a build, else llamacpp.py builds one.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
GGUF_OF = {"fp32": "f32", "bf16": "bf16", "int8": "q8_0", "int4": "q4_0", "int4q8": "q4_0"}
TOLERANCE = {"f32": 1e-3, "bf16": 5e-2, "q8_0": 5e-2, "q4_0": 5e-2}
ISA = ["sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
       "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"]


def say(msg):
    print(msg, flush=True)


def machine(label):
    load = Path("/proc/loadavg").read_text().split()[:3]
    say(f"# load_average_{label}={','.join(load)}")


def cpu_line():
    text = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    flags = set(re.search(r"^flags\s*:\s*(.*)$", text, re.M).group(1).split())
    say(f"# cpu={model.group(1) if model else 'unknown'} cores={os.cpu_count()} "
        f"isa={','.join(f for f in ISA if f in flags)}")


def out(cmd):
    print("+ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"compare: {cmd[0]} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


class Nxd:
    def __init__(self, build: Path, model: str):
        self.bench = build / "bench" / "nxd-bench-inference"
        self.ckpt = build / "tools" / "nxd-ckpt"
        self.generate = build / "tools" / "nxd-generate"
        for p in (self.bench, self.ckpt):
            if not p.is_file():
                sys.exit(f"compare: {p} missing: cmake --build {build} --target "
                         "nxd-bench-inference nxd-ckpt nxd-generate")
        self.model = model

    def inference(self, *args):
        return out([self.bench, "--model", self.model, *args])


def prepare(nxd: Nxd, work: Path, prompt: int):
    """The HF folder, the nxd checkpoint and the four GGUF files (each skipped when present)."""
    hf, ck = work / "model", work / "ckpt"
    if not (hf / "tokenizer.json").is_file():
        say(nxd.inference("--export", hf, "--prompt", prompt).strip())
    if not (ck / "imported").is_dir():
        out([nxd.ckpt, "import-hf", hf, ck])
    for t in dict.fromkeys(GGUF_OF.values()):  # q4_0 serves int4 and int4q8
        f = work / f"model-{t}.gguf"
        if not f.is_file():
            say(out([nxd.ckpt, "export-gguf", ck / "imported", f, "--type", t, "--tokenizer",
                     hf / "tokenizer.json"]).strip())
    return json.loads((hf / "config.json").read_text())


def check_logits(nxd: Nxd, logits_prog: Path, work: Path, cfg: dict, prompt: int):
    import numpy as np

    ids = [(i * 7919 + 13) % cfg["vocab_size"] for i in range(prompt)]
    (work / "prompt_ids.txt").write_text(" ".join(map(str, ids)) + "\n")
    ok = True
    for t, tol in TOLERANCE.items():
        f = work / f"model-{t}.gguf"
        out([logits_prog, f, work / "prompt_ids.txt", work / f"llamacpp-{t}.f32", "--threads", 1])
        nxd.inference("--logits-gguf", f, "--logits-out", work / f"nxd-{t}.f32", "--prompt", prompt)
        a = np.fromfile(work / f"llamacpp-{t}.f32", np.float32)
        b = np.fromfile(work / f"nxd-{t}.f32", np.float32)
        if a.shape != b.shape:
            sys.exit(f"compare: {t}: llama.cpp gave {a.size} logits, nxd {b.size}")
        diff = float(np.abs(a - b).max())
        rel = diff / float(np.abs(b).max())
        agree = rel <= tol
        ok = ok and agree
        say(f"logits gguf={t} max_abs_diff={diff:.3e} rel_diff={rel:.3e} limit={tol:.0e} "
            f"argmax_same={int(a.argmax() == b.argmax())} {'ok' if agree else 'DISAGREE'}")
    ref = np.fromfile(work / "model" / "prefill_logits.f32", np.float32)
    f32 = np.fromfile(work / "nxd-f32.f32", np.float32)
    say(f"logits nxd_f32_gguf_vs_original max_abs_diff={float(np.abs(ref - f32).max()):.3e}")
    if not ok:
        sys.exit("compare: llama.cpp and nxd disagree on the logits: refusing to time")


def llama_bench(lc, gguf, threads, reps, kv, prompt, gen, depth):
    cmd = [lc.tool("llama-bench"), "-m", gguf, "-t", threads, "-r", reps, "-o", "json",
           "-ctk", kv, "-ctv", kv, "-p", prompt, "-n", gen, "-d", depth]
    rows = json.loads(out(cmd))
    if len(rows) != 1:
        sys.exit(f"compare: llama-bench printed {len(rows)} results, expected 1")
    tokens = prompt if prompt else gen
    return tokens / (statistics.median(rows[0]["samples_ns"]) * 1e-9)


def llama_bytes(sizes, cfg, kv_bytes, context):
    weights = sum(v for k, v in sizes.items()
                  if not k.endswith(":row") and k != "token_embd.weight")
    kv_dim = cfg["hidden_size"] // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    kv = 2 * cfg["num_hidden_layers"] * kv_dim * kv_bytes * context
    return weights, weights + sizes["token_embd.weight:row"] + kv


def time_cases(nxd, lc, work, cfg, a):
    for threads in a.threads:
        for prec in a.precisions:
            t = GGUF_OF[prec]
            gguf = work / f"model-{t}.gguf"
            kv = "bf16" if prec == "bf16" else "f16"  # llama-bench has no f32 KV cache
            l_pre = llama_bench(lc, gguf, threads, a.reps, kv, a.prompt, 0, 0)
            l_dec = llama_bench(lc, gguf, threads, a.reps, kv, 0, a.gen, a.prompt)
            head = ["--head", a.quantize_head] if prec in ("int8", "int4", "int4q8") else []
            lines = nxd.inference(*head, "--threads", threads, "--precision", prec, "--prompt",
                                  a.prompt, "--reps", a.reps, "--no-traced").splitlines()
            n = {fields(x)["case"]: fields(x) for x in lines if x.startswith("case=")}
            step_bytes = int(n["decode"]["step_bytes"])
            bandwidth = step_bytes / (float(n["decode"]["stream_ms"]) * 1e-3)  # bytes/s
            weights, l_step = llama_bytes(llamacpp.gguf_tensor_bytes(gguf), cfg,
                                          2, a.prompt + 1)
            for case, l_tok_s, nx_tok_s, nb, lb in (
                    ("prefill", l_pre, float(n["prefill"]["nxd_tok_s"]),
                     step_bytes / a.prompt, weights / a.prompt),
                    ("decode", l_dec, float(n["decode"]["nxd_tok_s"]), step_bytes, l_step)):
                say(f"case={case} threads={threads} precision={prec} gguf={t} "
                    f"llamacpp_tok_s={l_tok_s:.1f} nxd_tok_s={nx_tok_s:.1f} "
                    f"ratio={nx_tok_s / l_tok_s:.3f} bytes_per_token={nb:.0f} "
                    f"llamacpp_bytes_per_token={lb:.0f} "
                    f"roofline_fraction={nb / bandwidth * nx_tok_s:.3f} "
                    f"llamacpp_roofline_fraction={lb / bandwidth * l_tok_s:.3f}")


def speculative(nxd, work, a):
    draft = work / "draft"
    if not (draft / "config.json").is_file():
        out([nxd.bench, "--model", "tiny" if a.smoke else "draft", "--export", draft, "--prompt",
             a.prompt])
    base = [nxd.generate, "--hf", work / "model", "--eager", "--prompt", "The bench prompt " * 8,
            "--max-new-tokens", 64 if not a.smoke else 8, "--temperature", 0]
    for threads in a.threads:
        env_threads = {"NXD_NUM_THREADS": str(threads)}
        plain = run_generate(base, env_threads)
        say(f"case=speculative threads={threads} k=0 tok_s={plain['tok_s']:.1f}")
        for k in (2, 4, 8):
            r = run_generate(base + ["--draft-model", draft, "--speculate", k], env_threads)
            say(f"case=speculative threads={threads} k={k} tok_s={r['tok_s']:.1f} "
                f"vs_plain={r['tok_s'] / plain['tok_s']:.3f} acceptance={r['acceptance']}")


def run_generate(cmd, env):
    print("+ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       env={**os.environ, **env})
    if r.returncode != 0:
        sys.exit(f"compare: nxd-generate failed ({r.returncode}):\n{r.stderr}")
    dec = re.search(r"^decode: (\d+) tokens in ([0-9.]+) ms", r.stdout, re.M)
    pre = re.search(r"^prefill: \d+ tokens in ([0-9.]+) ms", r.stdout, re.M)
    acc = re.search(r"^speculative: .*\(([0-9.]+)%\), ([0-9.]+) tokens per step", r.stdout, re.M)
    if not dec:
        sys.exit(f"compare: nxd-generate printed no decode line:\n{r.stdout}")
    ms = float(dec.group(2)) + (float(pre.group(1)) if pre else 0.0)  # prefill included
    return {"tok_s": int(dec.group(1)) / (ms * 1e-3),
            "acceptance": f"{float(acc.group(1)) / 100:.3f} tokens_per_step={acc.group(2)}"
            if acc else "-"}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nxd-build", type=Path, default=REPO / "build" / "release")
    p.add_argument("--work", type=Path, default=None,
                   help="models and logits (default <nxd build>/llamacpp_compare)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--precisions", default="fp32,bf16,int8,int4")
    p.add_argument("--quantize-head", default="none", choices=["none", "int8", "int4"],
                   help="nxd's int8/int4 output head (default none: f32, as before)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--gen", type=int, default=32)
    p.add_argument("--speculative", action="store_true")
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    a.threads = [int(x) for x in a.threads.split(",")]
    a.precisions = a.precisions.split(",")
    for x in a.precisions:
        if x not in GGUF_OF:
            p.error(f"--precisions {x}: expected one of {', '.join(GGUF_OF)}")
    model = "bench"
    if a.smoke:
        model, a.threads, a.reps, a.prompt, a.gen = "tiny", [1], 1, 16, 4
    elif a.reps < 5:
        p.error(f"--reps {a.reps}: medians of at least 5 runs (or --smoke)")
    nxd_build = a.nxd_build.resolve()
    work = (a.work or nxd_build / ("llamacpp_compare" + ("_smoke" if a.smoke else ""))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cpu_line()
    machine("start")
    lc = llamacpp.ensure_build(nxd_build / "llamacpp")
    say(f"# llama.cpp {lc.commit()} at {lc.build}")
    nxd = Nxd(nxd_build, model)
    logits_prog = llamacpp.build_logits_program(lc, HERE / "llamacpp_logits.cpp",
                                                work / "llamacpp-logits")
    cfg = prepare(nxd, work, a.prompt)
    check_logits(nxd, logits_prog, work, cfg, a.prompt)
    time_cases(nxd, lc, work, cfg, a)
    if a.speculative:
        speculative(nxd, work, a)
    machine("end")


if __name__ == "__main__":
    main()
