#!/usr/bin/python3
"""A transformers folder and the logits of its model on fixed tokens, computed in plain PyTorch
with transformers' semantics (LlamaForCausalLM, GPTNeoXForCausalLM: RMSNorm / LayerNorm, rotate-half
RoPE with rope_theta / rotary_emb_base and rope_scaling linear / llama3, partial rotary, GQA,
SwiGLU or GELU (erf or tanh), parallel or sequential residual, biases, head_dim, tied head;
Qwen2ForCausalLM: q/k/v biases; Qwen3ForCausalLM: q_norm/k_norm per head, head_dim (default 128);
MistralForCausalLM: sliding_window, key j visible to query i iff i - window < j <= i).

usage: hf_reference.py SPEC.json   (a list of {"out": OUT_DIR, "config": CONFIG, "options": OPTIONS})
  CONFIG: config.json's content (model_type llama, qwen2, qwen3, mistral or gpt_neox and its keys)
  OPTIONS: {"dtype": "F32"|"BF16"|"F16", "shards": N (>1: model.safetensors.index.json),
                      "inv_freq": bool (write rotary_emb.inv_freq buffers),
                      "head_copy": bool (tied: also write lm_head/embed_out.weight)}
Writes OUT_DIR/{config.json, model.safetensors or shards + index, logits.bin (f32 [S, V]),
tokens.json}. Weights are stored in `dtype`; the model computes in float32 from the stored values
(what transformers does when it loads a checkpoint without torch_dtype).
"""
import json
import math
import os
import struct
import sys

import torch

torch.manual_seed(0)


def write_safetensors(path, tensors, dtype):
    codes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.to(codes[dtype]).reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if dtype != "F32" \
            else t.float().contiguous().numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def stored(t, dtype):  # the value the file holds, back in f32
    return {"F32": t, "BF16": t.bfloat16().float(), "F16": t.half().float()}[dtype]


def rope_inv_freq(dim, base, scaling):
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "llama3":
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        out = torch.where(wl > lo_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wl < hi_wl) & ~(wl > lo_wl)
        return torch.where(medium, smoothed, out)
    raise ValueError(kind)


def rotate(x, inv):  # x [B,H,S,R]: rotate-half rotary on all R features
    s = x.shape[2]
    f = torch.outer(torch.arange(s, dtype=torch.float64), inv)
    emb = torch.cat([f, f], dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attention(q, k, v, window=None):  # [B,H,S,D], k/v [B,Hkv,S,D]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = q.shape[2]
    s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    if window:  # transformers' sliding window: kv_idx > q_idx - sliding_window
        s = s.masked_fill(torch.tril(torch.ones(n, n, dtype=torch.bool), -window), float("-inf"))
    return s.softmax(-1) @ v


LLAMA_FAMILY = ("llama", "qwen2", "qwen3", "mistral")


def head_dim(c):
    if c.get("head_dim"):
        return c["head_dim"]
    return 128 if c["model_type"] == "qwen3" else c["hidden_size"] // c["num_attention_heads"]


def biases(c):  # (q/k/v, o_proj, mlp) biases of the llama family
    t = c["model_type"]
    if t == "qwen2":
        return True, False, False
    if t == "mistral":
        return False, False, False
    ab = c.get("attention_bias", False)
    return ab, ab, c.get("mlp_bias", False) if t == "llama" else False


def sliding_window(c):
    t = c["model_type"]
    if t == "mistral":
        return c.get("sliding_window", 4096)
    if t in ("qwen2", "qwen3") and c.get("use_sliding_window"):
        assert c.get("max_window_layers", 0) == 0
        return c.get("sliding_window")
    return None


def act(name, x):
    if name == "silu":
        return torch.nn.functional.silu(x)
    if name == "gelu":
        return torch.nn.functional.gelu(x)
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    raise ValueError(name)


def llama(c, w, ids):
    H, d = c["num_attention_heads"], c["hidden_size"]
    Hkv = c.get("num_key_value_heads", H)
    D = head_dim(c)
    inv = rope_inv_freq(D, c.get("rope_theta", 10000.0), c.get("rope_scaling"))
    eps = c["rms_norm_eps"]
    window = sliding_window(c)

    def rms(x, wt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * wt

    def lin(x, name, bias):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if bias else y

    qb, ob, mb = biases(c)
    h = w["model.embed_tokens.weight"][ids][None]
    S = h.shape[1]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        q = lin(x, p + "self_attn.q_proj", qb).view(1, S, H, D)
        k = lin(x, p + "self_attn.k_proj", qb).view(1, S, Hkv, D)
        if c["model_type"] == "qwen3":  # Qwen3Attention: q_norm / k_norm over head_dim
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = lin(x, p + "self_attn.v_proj", qb).view(1, S, Hkv, D).transpose(1, 2)
        a = attention(rotate(q, inv), rotate(k, inv), v, window).transpose(1, 2).reshape(1, S, H * D)
        h = h + lin(a, p + "self_attn.o_proj", ob)
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        g = act(c.get("hidden_act", "silu"), lin(x, p + "mlp.gate_proj", mb))
        h = h + lin(g * lin(x, p + "mlp.up_proj", mb), p + "mlp.down_proj", mb)
    h = rms(h, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return (h @ head.T)[0]


def gpt_neox(c, w, ids):
    H, d = c["num_attention_heads"], c["hidden_size"]
    D = d // H
    R = int(D * c.get("rotary_pct", 0.25))
    inv = rope_inv_freq(R, c.get("rotary_emb_base", 10000.0), c.get("rope_scaling"))
    eps = c["layer_norm_eps"]

    def ln(x, name):
        return torch.nn.functional.layer_norm(x, (d,), w[name + ".weight"], w[name + ".bias"], eps)

    def lin(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    h = w["gpt_neox.embed_in.weight"][ids][None]
    S = h.shape[1]
    for i in range(c["num_hidden_layers"]):
        p = f"gpt_neox.layers.{i}."
        qkv = lin(ln(h, p + "input_layernorm"), p + "attention.query_key_value")
        qkv = qkv.view(1, S, H, 3 * D).transpose(1, 2)
        q, k, v = qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:]
        q = torch.cat([rotate(q[..., :R], inv), q[..., R:]], dim=-1)
        k = torch.cat([rotate(k[..., :R], inv), k[..., R:]], dim=-1)
        a = lin(attention(q, k, v).transpose(1, 2).reshape(1, S, d), p + "attention.dense")

        def mlp(x):
            y = act(c.get("hidden_act", "gelu"), lin(x, p + "mlp.dense_h_to_4h"))
            return lin(y, p + "mlp.dense_4h_to_h")

        if c.get("use_parallel_residual", True):
            h = h + a + mlp(ln(h, p + "post_attention_layernorm"))
        else:
            h = h + a
            h = h + mlp(ln(h, p + "post_attention_layernorm"))
    h = ln(h, "gpt_neox.final_layer_norm")
    head = w["gpt_neox.embed_in.weight"] if c.get("tie_word_embeddings") else w["embed_out.weight"]
    return (h @ head.T)[0]


def weights(c):
    V, d, L, F = c["vocab_size"], c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
    H = c["num_attention_heads"]
    w = {}

    def r(name, *shape, std=0.2):
        w[name] = torch.randn(*shape) * std

    if c["model_type"] in LLAMA_FAMILY:
        Hkv = c.get("num_key_value_heads", H)
        D = head_dim(c)
        qb, ob, mb = biases(c)
        r("model.embed_tokens.weight", V, d, std=0.3)
        for i in range(L):
            p = f"model.layers.{i}."
            for n, o, ii in (("q", H * D, d), ("k", Hkv * D, d), ("v", Hkv * D, d), ("o", d, H * D)):
                r(p + f"self_attn.{n}_proj.weight", o, ii)
                if (ob if n == "o" else qb):
                    r(p + f"self_attn.{n}_proj.bias", o)
            if c["model_type"] == "qwen3":
                w[p + "self_attn.q_norm.weight"] = 1 + torch.randn(D) * 0.1
                w[p + "self_attn.k_norm.weight"] = 1 + torch.randn(D) * 0.1
            for n, o, ii in (("gate", F, d), ("up", F, d), ("down", d, F)):
                r(p + f"mlp.{n}_proj.weight", o, ii)
                if mb:
                    r(p + f"mlp.{n}_proj.bias", o)
            w[p + "input_layernorm.weight"] = 1 + torch.randn(d) * 0.1
            w[p + "post_attention_layernorm.weight"] = 1 + torch.randn(d) * 0.1
        w["model.norm.weight"] = 1 + torch.randn(d) * 0.1
        if not c.get("tie_word_embeddings"):
            r("lm_head.weight", V, d)
    else:
        r("gpt_neox.embed_in.weight", V, d, std=0.3)
        for i in range(L):
            p = f"gpt_neox.layers.{i}."
            for n in ("input_layernorm", "post_attention_layernorm"):
                w[p + n + ".weight"] = 1 + torch.randn(d) * 0.1
                r(p + n + ".bias", d, std=0.1)
            for n, o, ii in (("attention.query_key_value", 3 * d, d), ("attention.dense", d, d),
                             ("mlp.dense_h_to_4h", F, d), ("mlp.dense_4h_to_h", d, F)):
                r(p + n + ".weight", o, ii)
                r(p + n + ".bias", o, std=0.1)
        w["gpt_neox.final_layer_norm.weight"] = 1 + torch.randn(d) * 0.1
        r("gpt_neox.final_layer_norm.bias", d, std=0.1)
        if not c.get("tie_word_embeddings"):
            r("embed_out.weight", V, d)
    return w


def make(out, c, opt):
    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)
    dtype = opt.get("dtype", "F32")
    w = {n: stored(t, dtype) for n, t in weights(c).items()}
    ids = torch.tensor([(7 * i * i + 3 * i + 1) % c["vocab_size"] for i in range(int(opt.get("seq", 24)))])
    fam = c["model_type"] in LLAMA_FAMILY
    logits = (llama if fam else gpt_neox)(c, w, ids)
    files = dict(w)
    head = "lm_head.weight" if fam else "embed_out.weight"
    emb = "model.embed_tokens.weight" if fam else "gpt_neox.embed_in.weight"
    if opt.get("head_copy"):
        files[head] = w[emb].clone()
    if opt.get("inv_freq"):
        for i in range(c["num_hidden_layers"]):
            p = (f"model.layers.{i}.self_attn" if fam
                 else f"gpt_neox.layers.{i}.attention")
            files[p + ".rotary_emb.inv_freq"] = torch.ones(4)
            if c["model_type"] == "gpt_neox":
                files[p + ".bias"] = torch.ones(1, 1, 4, 4)
                files[p + ".masked_bias"] = torch.tensor(-1e9)
    shards = int(opt.get("shards", 1))
    if shards > 1:
        names = list(files)
        wm = {}
        for s in range(shards):
            fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: files[n] for n in names[s::shards]}
            write_safetensors(os.path.join(out, fn), part, dtype)
            wm.update({n: fn for n in part})
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f)
    else:
        write_safetensors(os.path.join(out, "model.safetensors"), files, dtype)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump(ids.tolist(), f)
    logits.float().contiguous().numpy().tofile(os.path.join(out, "logits.bin"))


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        for spec in json.load(f):
            make(spec["out"], spec["config"], spec.get("options", {}))
