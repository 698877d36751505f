"""A plain-PyTorch Llama with PEFT LoRA adapters, against nxd's logits.

usage: lora_reference.py DIR
DIR/base/{config.json, model.safetensors}  the base model (transformers' names and config keys)
DIR/adapter/{adapter_config.json, adapter_model.safetensors}  a PEFT LoRA adapter
DIR/nxd.safetensors  ids [B, S] and nxd's logits [B, S, V]
Computes transformers' Llama math in float64 (RMSNorm, rotate_half rotary, grouped-query causal
attention, SwiGLU), every adapted linear as x W^T + (lora_alpha / r) (x A^T) B^T, prints the largest
logit difference and exits 1 when it exceeds 1e-5. Reads safetensors without the safetensors
package (its format: 8-byte header length, JSON header, raw little-endian data).
"""
import json
import math
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16,
          "F16": torch.float16, "I64": torch.int64, "I32": torch.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        buf = bytearray(data[8 + n + lo:8 + n + hi])
        t = torch.frombuffer(buf, dtype=DTYPES[info["dtype"]]) if buf else torch.empty(0)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def main(d):
    cfg = json.load(open(f"{d}/base/config.json"))
    w = {k: v.double() for k, v in read_safetensors(f"{d}/base/model.safetensors").items()}
    acfg = json.load(open(f"{d}/adapter/adapter_config.json"))
    assert acfg["peft_type"] == "LORA" and not acfg.get("use_rslora", False)
    scale = acfg["lora_alpha"] / acfg["r"]
    lora = {}
    for k, v in read_safetensors(f"{d}/adapter/adapter_model.safetensors").items():
        assert k.startswith("base_model.model.") and k.endswith((".lora_A.weight", ".lora_B.weight")), k
        lora[k[len("base_model.model."):]] = v.double()
    ref = read_safetensors(f"{d}/nxd.safetensors")
    ids, nxd_logits = ref["ids"].long(), ref["logits"].double()

    def linear(x, name):
        y = x @ w[name + ".weight"].T
        if name + ".lora_A.weight" in lora:
            y = y + scale * ((x @ lora[name + ".lora_A.weight"].T) @ lora[name + ".lora_B.weight"].T)
        return y

    def rms_norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]) * weight

    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    B, S = ids.shape
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(S, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(x):
        return torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)

    mask = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)
    h = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"])
        q = linear(x, p + "self_attn.q_proj").view(B, S, H, D).transpose(1, 2)
        k = linear(x, p + "self_attn.k_proj").view(B, S, Hkv, D).transpose(1, 2)
        v = linear(x, p + "self_attn.v_proj").view(B, S, Hkv, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, -1) @ v
        h = h + linear(a.transpose(1, 2).reshape(B, S, H * D), p + "self_attn.o_proj")
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"])
        g, u = linear(x, p + "mlp.gate_proj"), linear(x, p + "mlp.up_proj")
        h = h + linear(torch.nn.functional.silu(g) * u, p + "mlp.down_proj")
    h = rms_norm(h, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    logits = h @ head.T
    used = {n.rsplit(".lora_", 1)[0] for n in lora}
    diff = (logits - nxd_logits).abs().max().item()
    print(f"PyTorch LoRA reference (float64, {len(used)} adapted layers, scale {scale}) vs nxd: "
          f"largest logit difference {diff:.3g} (logits up to {logits.abs().max().item():.3g})")
    return 0 if diff <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
