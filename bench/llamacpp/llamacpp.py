"""llama.cpp for nxd's baselines: build it (or reuse a build), and read a GGUF file's tensor sizes.

ensure_build() returns a LlamaCpp with the build's bin folder and source tree. With
NXD_LLAMACPP_BUILD=DIR an existing CMake build of llama.cpp is reused (its source tree is read from
DIR/CMakeCache.txt); otherwise llama.cpp is built under CACHE (default <nxd build>/llamacpp):
`npm pack node-llama-cpp@VERSION` (its package/llama/gitRelease.bundle is a git bundle of the
llama.cpp it ships), a clone of that bundle, and a CPU-only Release build of llama-bench,
llama-server, llama-quantize, llama-cli and libllama. Each step is skipped when its output exists.
"""

import os
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

NODE_LLAMA_CPP = os.environ.get("NXD_NODE_LLAMA_CPP_VERSION", "3.22.1")
TARGETS = ["llama-bench", "llama-server", "llama-quantize", "llama-cli", "llama"]


@dataclass
class LlamaCpp:
    build: Path  # the CMake build folder
    src: Path  # the source tree

    @property
    def bin(self) -> Path:
        return self.build / "bin"

    def tool(self, name: str) -> Path:
        p = self.bin / name
        if not p.is_file():
            sys.exit(f"compare: {p} missing: the llama.cpp build at {self.build} lacks {name}")
        return p

    def commit(self) -> str:
        r = subprocess.run(["git", "-C", str(self.src), "rev-parse", "--short=12", "HEAD"],
                           capture_output=True, text=True)
        return r.stdout.strip() or "unknown"


def run(cmd, **kw):
    print("+ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def source_of(build: Path) -> Path:
    cache = build / "CMakeCache.txt"
    if not cache.is_file():
        sys.exit(f"compare: NXD_LLAMACPP_BUILD={build}: no CMakeCache.txt (not a CMake build)")
    m = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache.read_text(), re.M)
    if not m:
        sys.exit(f"compare: {cache} names no source directory")
    return Path(m.group(1))


def ensure_build(cache: Path, needs=("llama-bench",), jobs: int = 2) -> LlamaCpp:
    """`needs`: the programs a given build (NXD_LLAMACPP_BUILD) must have."""
    given = os.environ.get("NXD_LLAMACPP_BUILD")
    if given:
        build = Path(given).resolve()
        lc = LlamaCpp(build, source_of(build))
        for t in needs:
            lc.tool(t)
        return lc
    cache.mkdir(parents=True, exist_ok=True)
    src, build = cache / "src", cache / "build"
    bundle = cache / "package" / "llama" / "gitRelease.bundle"
    if not bundle.is_file():
        if not shutil.which("npm"):
            sys.exit("compare: npm is needed to fetch llama.cpp (or set NXD_LLAMACPP_BUILD)")
        run(["npm", "pack", "--loglevel=warn", f"node-llama-cpp@{NODE_LLAMA_CPP}",
             "--pack-destination", cache], stdout=subprocess.DEVNULL)
        tgz = cache / f"node-llama-cpp-{NODE_LLAMA_CPP}.tgz"
        run(["tar", "xzf", tgz, "-C", cache])
        if not bundle.is_file():
            sys.exit(f"compare: {tgz} has no package/llama/gitRelease.bundle")
    if not (src / "CMakeLists.txt").is_file():
        run(["git", "clone", "--quiet", "--no-checkout", bundle, src])
        head = subprocess.run(["git", "ls-remote", str(bundle), "HEAD"], capture_output=True,
                              text=True, check=True).stdout.split()[0]
        run(["git", "-C", src, "checkout", "--quiet", "--detach", head])
    if not (build / "bin" / "llama-server").is_file():
        run(["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
             "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", "-DLLAMA_CURL=OFF",
             "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=ON"], stdout=subprocess.DEVNULL)
        run(["cmake", "--build", build, "-j", str(jobs), "--target", *TARGETS],
            stdout=subprocess.DEVNULL)
    return LlamaCpp(build, src)


def build_logits_program(lc: LlamaCpp, source: Path, out: Path) -> Path:
    """Compiles bench/llamacpp/llamacpp_logits.cpp against the build's libllama."""
    if out.is_file() and out.stat().st_mtime > source.stat().st_mtime:
        return out
    libs = [f"-l{n}" for n in ("llama", "ggml", "ggml-base")]
    run([os.environ.get("CXX", "g++"), "-O2", "-std=c++17", f"-I{lc.src / 'include'}",
         f"-I{lc.src / 'ggml' / 'include'}", source, "-o", out, f"-L{lc.bin}", *libs,
         f"-Wl,-rpath,{lc.bin}"])
    return out


# ggml type -> (block values, block bytes), for the types nxd exports.
GGML_SIZES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34), 30: (1, 2)}


def gguf_tensor_bytes(path: Path) -> dict:
    """{tensor name: bytes} of a GGUF v3 file (the header only)."""
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

        def rstr():
            return f.read(rd("Q")).decode("utf-8")

        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                  11: "q", 12: "d"}

        def skip_value(t):
            if t == 8:
                rstr()
            elif t == 9:
                et, n = rd("I"), rd("Q")
                for _ in range(n):
                    skip_value(et)
            else:
                rd(scalar[t])

        if f.read(4) != b"GGUF":
            sys.exit(f"compare: {path} is not a GGUF file")
        rd("I")
        n_tensors, n_kv = rd("Q"), rd("Q")
        for _ in range(n_kv):
            rstr()
            skip_value(rd("I"))
        out = {}
        for _ in range(n_tensors):
            name = rstr()
            dims = [rd("Q") for _ in range(rd("I"))]
            t = rd("I")
            rd("Q")
            if t not in GGML_SIZES:
                sys.exit(f"compare: {path}: tensor {name} has ggml type {t}, not one nxd writes")
            per, size = GGML_SIZES[t]
            n = 1
            for d in dims:
                n *= d
            out[name] = (n // per) * size
            out[name + ":row"] = (dims[0] // per) * size
        return out
