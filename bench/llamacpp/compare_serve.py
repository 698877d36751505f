#!/usr/bin/python3
"""nxd-serve against llama-server (issue 36): prepares model and llama.cpp, runs nxd-bench-serve.

  /usr/bin/python3 bench/llamacpp/compare_serve.py [--nxd-build build/release] [--work DIR]
      [--smoke] [-- nxd-bench-serve flags...]

The model is the inference bench's ~125M Llama (nxd-bench-inference --export, with
max_position_embeddings 8192 so that the 4096-token prompt of the chunked-prefill case fits), its
f32 GGUF export (nxd-ckpt import-hf, export-gguf --type f32: the same weights for llama-server),
and llama.cpp as in compare_inference.py (NXD_LLAMACPP_BUILD=DIR reuses a build). Then
nxd-bench-serve --hf MODEL --gguf FILE --llama-server PATH [flags after --]. --smoke uses the tiny
model and passes --smoke (seconds).
"""

import argparse
import subprocess
import sys
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nxd-build", type=Path, default=REPO / "build" / "release")
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    build = a.nxd_build.resolve()
    work = (a.work or build / ("llamacpp_serve" + ("_smoke" if a.smoke else ""))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    tools = {"bench": build / "bench" / "nxd-bench-inference",
             "ckpt": build / "tools" / "nxd-ckpt",
             "serve": build / "tools" / "nxd-serve",
             "bench_serve": build / "bench" / "nxd-bench-serve"}
    for path in tools.values():
        if not path.is_file():
            sys.exit(f"compare_serve: {path} missing: cmake --build {build} --target "
                     "nxd-bench-inference nxd-ckpt nxd-serve nxd-bench-serve")
    lc = llamacpp.ensure_build(build / "llamacpp", needs=("llama-server",))
    hf, ck, gguf = work / "model", work / "ckpt", work / "model-f32.gguf"
    model = ["--model", "tiny"] if a.smoke else ["--max-positions", "8192"]
    if not (hf / "tokenizer.json").is_file():
        llamacpp.run([tools["bench"], *model, "--export", hf])
    if not (ck / "imported").is_dir():
        llamacpp.run([tools["ckpt"], "import-hf", hf, ck])
    if not gguf.is_file():
        llamacpp.run([tools["ckpt"], "export-gguf", ck / "imported", gguf, "--type", "f32",
                      "--tokenizer", hf / "tokenizer.json"])
    cmd = [tools["bench_serve"], "--hf", hf, "--gguf", gguf, "--llama-server",
           lc.tool("llama-server"), "--nxd-serve", tools["serve"], "--work", work / "logs",
           *(["--smoke"] if a.smoke else []), *extra]
    print(f"# llama.cpp {lc.commit()} at {lc.build}", flush=True)
    print("+ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    sys.exit(subprocess.run([str(c) for c in cmd]).returncode)


if __name__ == "__main__":
    main()
