#pragma once
// Packed sequences (SFT packing): several documents in one row of ids, each attending only to
// itself with positions restarting at 0, as if it ran alone. The caller describes the packing by
// each token's position in its document, positions [B, S] i64 (0 where a document starts, else
// the previous + 1), and runs the model's forward inside a DocumentScope; every
// CausalSelfAttention then applies rotary at those positions (rotary_at_positions) and attends
// within documents (document_attention, the fused kernel with document boundaries). Outside a
// scope nothing changes.
//
// The scope is per rank (a Context slot), holds for the forward calls made inside it, and is
// captured by what replays the forward later: the attention core's selective recomputation and
// a layer's full recomputation (recompute_layer) re-enter it in backward. Context parallelism and
// the KV-cache path refuse positions (InvalidArgument naming them); under sequence parallelism the
// rows padded to a multiple of TP continue the last document (causal: no real token sees them).
#include "nxd/runtime/tensor.h"

namespace nxd {

class DocumentScope {
 public:
  // positions [B, S] i32/i64; undefined: no packing (a scope that changes nothing).
  explicit DocumentScope(const Tensor& positions);
  ~DocumentScope();
  DocumentScope(const DocumentScope&) = delete;
  DocumentScope& operator=(const DocumentScope&) = delete;

 private:
  Tensor prev_;
};

// The positions of the innermost scope on this rank, or an undefined tensor.
Tensor current_document_positions();

// positions [B, S] extended to [B, length] (length >= S): the added entries continue the last
// document of each row.
Tensor extend_document_positions(const Tensor& positions, int64_t length);

}  // namespace nxd
