#pragma once
// Differentiable neural-network ops, each backed by a fused kernel in runtime/kernels/.
// Floating dtypes f32, f64 and bf16 (bf16 computes in f32 and rounds once).
#include <cstdint>

#include "nxd/autograd/graph.h"
#include "nxd/runtime/rng.h"
#include "nxd/runtime/rope_scaling.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

// Over the last dim. weight/bias [D] may be undefined (no affine).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// x * rsqrt(mean(x^2) + eps) * weight, over the last dim (Llama's RMSNorm; weight may be
// undefined).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

enum class GeluApprox { none, tanh };  // erf form, or the tanh approximation (gelu_new)
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::tanh);
Tensor silu(const Tensor& x);
// silu(gate) * up, fused (Llama's MLP).
Tensor swiglu(const Tensor& gate, const Tensor& up);

// ids: i32/i64 [...], weight: [V, D] -> [..., D]. Backward scatter-adds into dweight.
// An id outside [0, V) throws naming the id and V.
Tensor embedding(const Tensor& ids, const Tensor& weight);

enum class Reduction { none, sum, mean };
struct CrossEntropyOptions {
  int64_t ignore_index = -100;   // targets equal to it contribute no loss and no gradient
  double label_smoothing = 0.0;  // PyTorch semantics: (1-ls)*nll + ls*mean_over_vocab(-logp)
  Reduction reduction = Reduction::mean;  // mean over non-ignored targets
};
// logits [N, V] (any float dtype, computed in f32/f64), targets [N] i32/i64 -> scalar (or [N]);
// the loss is f32 for bf16 logits (Hugging Face upcasts logits before the loss).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& opts = {});

// q [B, Hq, Sq, D], k and v [B, Hkv, Sk, D] with Hkv dividing Hq (grouped-query: query head h
// reads kv head h / (Hq / Hkv)). scale <= 0 means 1/sqrt(D). Causal: query i sees keys
// j <= i + Sk - Sq (Sk >= Sq). Returns [B, Hq, Sq, D].
// fused (the default): FlashAttention-style, the scores never exist whole; backward keeps q, k,
// v, the output and one f32 log-sum-exp per row and recomputes the probabilities block-wise
// (runtime/kernels/flash_attention.h). materialized: the reference path, softmax and mask fused
// between two GEMMs per head, the [B, Hq, Sq, Sk] probabilities kept for backward
// (runtime/kernels/attention.h).
enum class AttentionImpl { fused, materialized };
// window > 0 (causal, fused only): a sliding window, query i sees keys j with
// i + Sk - Sq - window < j <= i + Sk - Sq (transformers' sliding_window, Mistral's).
struct SdpaOptions {
  bool causal = true;
  double scale = 0.0;
  AttentionImpl impl = AttentionImpl::fused;
  int64_t window = 0;
};
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& opts);
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal = true, double scale = 0.0);

// Causal attention within packed documents (fused kernel only): positions [B, S] i32/i64 is each
// token's position in its document (0 where one starts, else the previous + 1; Sq == Sk == S);
// query i of row b attends keys [i - positions[b, i], i] only, so no token sees another
// document. Gradients flow to q, k, v (not positions). scale <= 0: 1/sqrt(D).
Tensor document_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& positions, double scale = 0.0);

// Rotary position embeddings (rotate-half convention of HF Llama and GPT-NeoX).
// Rotates the first `rotary_dim` features of each head (rotary_dim == D for Llama; a fraction
// for GPT-NeoX's partial rotary); the rest pass through. Pairs are (i, i + rotary_dim/2).
// x: [B, H, S, D]; positions start at `position_offset`.
struct RotaryOptions {
  int64_t rotary_dim = 0;  // 0 = the whole head dim
  double base = 10000.0;
  int64_t position_offset = 0;
  RopeScaling scaling;  // rope_scaling (linear, llama3): runtime/rope_scaling.h
};
Tensor rotary(const Tensor& x, const RotaryOptions& opts = {});
// rotary at per-token positions [B, S] i32/i64 (>= 0; opts.position_offset must be 0): token
// (b, s) is rotated exactly as rotary rotates position positions[b, s].
Tensor rotary_at_positions(const Tensor& x, const Tensor& positions, const RotaryOptions& opts);
// The attributes a tracer records for RotaryOptions (rotary, rotary_at), and back (a missing
// position_offset reads as 0).
OpAttrs rotary_attrs(const RotaryOptions& opts);
RotaryOptions rotary_options_from(const OpAttrs& attrs);

// Inverted dropout with probability p of zeroing; identity when !training or p == 0. The mask is
// drawn from `stream` (default: a fresh stream from the current context's generator).
Tensor dropout(const Tensor& x, double p, bool training = true, const RngStream* stream = nullptr);

}  // namespace nxd
