#!/usr/bin/env python3
"""Checks nxd's GGUF export against llama.cpp's own Python package (gguf-py).

usage: gguf_llamacpp_check.py LLAMA_CPP_SRC EXPORT.safetensors LAYERS FILE.gguf...

EXPORT.safetensors is `nxd-ckpt export` of the checkpoint the GGUF files were exported from
(`nxd-ckpt export-gguf ... --type T`). For every tensor of every file, gguf-py's GGUFReader must
read it and its bytes must equal what gguf-py itself produces from the transformers-layout weight:
llama.cpp's rotary permutation of q/k (conversion/llama.py LlamaModel.permute) and
gguf.quants.quantize for the tensor's type. Needs numpy (Debian: python3-numpy) and llama.cpp's
source tree (npm's node-llama-cpp package carries it as llama/gitRelease.bundle). Exit 0 when
every tensor matches, 1 otherwise.
"""
import json
import struct
import sys

import numpy as np


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        if v["dtype"] != "F32":
            raise SystemExit(f"{path}: {k} is {v['dtype']}, expected F32")
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(v["shape"])
    return out


def permute(w, n_head, n_head_kv):
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def main():
    src, st, layers, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    sys.path.insert(0, src + "/gguf-py")
    from gguf import GGUFReader, GGMLQuantizationType as Q, quants
    hf = read_safetensors(st)
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    pairs = [("input_layernorm", "attn_norm"), ("self_attn.q_proj", "attn_q"),
             ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
             ("self_attn.o_proj", "attn_output"), ("post_attention_layernorm", "ffn_norm"),
             ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
             ("mlp.down_proj", "ffn_down")]
    for i in range(layers):
        for a, b in pairs:
            names[f"model.layers.{i}.{a}.weight"] = f"blk.{i}.{b}.weight"
    by_gguf = {v: k for k, v in names.items()}
    failed = 0
    for f in files:
        r = GGUFReader(f)
        heads = int(r.fields["llama.attention.head_count"].parts[-1][0])
        kv = int(r.fields["llama.attention.head_count_kv"].parts[-1][0])
        same = 0
        for t in r.tensors:
            w = hf[by_gguf[t.name]]
            if ".attn_q." in t.name:
                w = permute(w, heads, heads)
            if ".attn_k." in t.name:
                w = permute(w, heads, kv)
            qt = Q(t.tensor_type)
            want = w if qt == Q.F32 else quants.quantize(w.astype(np.float32), qt)
            if want.tobytes() == np.asarray(t.data).tobytes():
                same += 1
            else:
                print(f"  {f}: {t.name} ({qt.name}) differs from gguf-py's")
        print(f"{f}: {same}/{len(r.tensors)} tensors byte-identical to gguf-py's")
        failed += same != len(r.tensors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
