#pragma once
// Fused causal attention (FlashAttention-style) with grouped-query heads: never materializes the
// [Sq, Sk] score matrix. The forward streams key/value blocks through an online softmax per
// (batch, query head, query block) and saves the log-sum-exp of every row; the backward
// recomputes each probability block from q, k and that log-sum-exp:
//   P = exp(scale Q K^T - lse),  D = rowsum(dO * O),  dV += P^T dO,  dS = P * (dO V^T - D),
//   dQ += scale dS K,  dK += scale dS^T Q.
// The backward runs one unit per (batch, kv head): the query heads of a group add into its dK and
// dV, and every dQ row is summed over the key blocks, in a fixed order on one thread, so results
// are bitwise the same at any thread count. Same operand conventions as attention.h.
#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// Query rows and key rows per block of the fused kernels (key blocks: a multiple of 16).
inline constexpr int64_t kFlashQueryBlock = 64, kFlashKeyBlock = 64;

// The backward's schedule. one_pass (the default): a unit per (batch, kv head) computes dQ, dK
// and dV together (five block GEMMs per block pair). two_pass: dK/dV per (batch, kv head, key
// block), then dQ per (batch, query head, query block): seven GEMMs per block pair, but units
// for every thread even when batch * kv heads is 1. Both add every gradient block in the same
// order: the results are bitwise the same. two_pass is opt-in: on the shared 2-core machine it
// could only be measured at 0.72-0.77x one_pass's speed (the other core was busy), and sim ranks
// sharing the cores would pay its extra GEMMs for nothing.
enum class FlashBackwardSchedule { one_pass, two_pass };
void set_flash_backward_schedule(FlashBackwardSchedule s);  // process-wide (tests, benches)
FlashBackwardSchedule flash_backward_schedule();

// out: [B, Hq, Sq, D] (unit last stride); lse: [B, Hq, Sq] contiguous in q's dtype (the
// log-sum-exp of each row's scaled scores, what the backward needs), or undefined (inference);
// q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D] as in attention_forward (Sk >= Sq when causal; query
// i sees keys j <= i + Sk - Sq). scale <= 0 means 1/sqrt(D). window > 0 (causal only): a
// sliding window, query i sees keys j with i + Sk - Sq - window < j <= i + Sk - Sq (Mistral's;
// key blocks wholly outside it are skipped).
void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, bool causal, double scale, int64_t window = 0);
// dq: [B, Hq, Sq, D]; dk, dv: [B, Hkv, Sk, D] (all overwritten; unit last stride); dout, q, k, v,
// out and lse as in the forward.
void flash_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, bool causal, double scale,
                              int64_t window = 0);

// Causal attention within documents (packed sequences): positions [B, S] i32/i64 (S == Sq == Sk)
// is each token's position in its document, 0 where a document starts and the previous one + 1
// elsewhere (checked, naming the first bad entry); query i of row b sees keys
// [i - positions[b, i], i], the keys of its own document up to itself, and no other. Key blocks
// wholly outside a query block's documents are skipped in both directions. Otherwise as above.
void flash_document_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                                      const Tensor& k, const Tensor& v, const Tensor& positions,
                                      double scale);
void flash_document_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                       const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       const Tensor& positions, double scale);

}  // namespace nxd::kernels
