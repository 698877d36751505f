#pragma once
// Context parallelism (Megatron-core's CP; NxD Training's context_parallel_size): the sequence of
// every sample is split over a context-parallel group of P ranks. Every layer but attention runs
// on the rank's own tokens unchanged; attention is ring attention: each rank keeps its queries
// and passes its key/value block around the ring, P steps, merging the partial outputs with the
// online-softmax statistics (the log-sum-exp of each row's scores), as the fused attention kernel
// merges key blocks within one rank. The backward passes K/V around the ring again, with the
// dK/dV accumulator of each block travelling with it; after P steps each accumulator is back at
// the rank that owns the block.
//
// Causal load balancing (CpLayout::balanced, the default): the sequence is cut into 2P chunks of
// c = S / (2P) tokens and rank r holds chunks r and 2P-1-r (in that order). Under the causal mask
// a late chunk sees many keys and an early one few: the pair gives every rank the same work. Per
// ring step, with the block of rank s:
//   s == r: both chunks against both (causal: the local order is the global order);
//   s <  r: both query chunks against s's first chunk (fully visible), its second is in the future;
//   s >  r: the second query chunk against both of s's chunks (fully visible), the first sees none.
// Every step is 2c x 2c of scores (the first, causal, counted whole as the kernel charges it):
// the same FLOPs on every rank. CpLayout::contiguous (rank r holds chunk r of P) is kept for the
// comparison: rank r then does r + 1 blocks.
//
// Shapes: q [B, Hq, S/P, D], k and v [B, Hkv, S/P, D] (this rank's rows in the layout's order),
// grouped-query as scaled_dot_product_attention; causal always. K/V travel in their own dtype
// (bf16 stays bf16), the dK/dV accumulators in the compute dtype (f32 for bf16 inputs).
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "nxd/autograd/ops.h"
#include "nxd/collectives/communicator.h"
#include "nxd/runtime/tensor.h"

namespace nxd {

enum class CpLayout { balanced, contiguous };

// The global [start, start + length) pieces of a sequence of `seq` tokens that rank `rank` of
// `size` holds, in local order. Throws ShapeError when seq does not divide by 2*size (balanced)
// or size (contiguous).
std::vector<std::pair<int64_t, int64_t>> context_parallel_spans(
    int64_t seq, int rank, int size, CpLayout layout = CpLayout::balanced);

// The rank's rows of `dim` of a global tensor (raw, a new contiguous tensor; no graph).
Tensor context_parallel_slice(const Tensor& x, int64_t dim, int rank, int size,
                              CpLayout layout = CpLayout::balanced);
// The global tensor from every member's rows of `dim` (raw all-gather, reordered into global
// order; the same on every member).
Tensor context_parallel_gather(const Tensor& local, int64_t dim, Communicator& group,
                               CpLayout layout = CpLayout::balanced);

struct RingAttentionOptions {
  double scale = 0.0;  // <= 0: 1/sqrt(D)
  CpLayout layout = CpLayout::balanced;
};

// Causal attention of this rank's queries over the keys of the whole sequence (see above);
// differentiable in q, k and v. A group of one rank is plain fused causal attention. The group
// must outlive the graph (a parallel_state group does).
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& group,
                      const RingAttentionOptions& opts = {});

// ---- the models' side (layers/models: a model is built over the parallel_state CP group current
// at construction, as over its TP group) ----

// The context-parallel group models are built over: parallel_state's CP group when it has more
// than one rank, else null.
std::shared_ptr<Communicator> model_context_parallel_group();
int model_context_parallel_size();  // its size, 1 without one

// Rotary embeddings of this rank's rows x [B, H, S/P, D] at their global positions
// (position_offset + each span's start): one rotary per span, concatenated.
Tensor context_parallel_rotary(const Tensor& x, const RotaryOptions& opts, Communicator& group,
                               CpLayout layout = CpLayout::balanced);

// The loss over the whole sequence from this rank's share: `local_sum` (a scalar, the sum of
// this rank's token losses) over the total `count` of counted tokens of every member (raw
// all-reduce of `local_count`): sum over the group / count, the same value on every member. Its
// backward gives each member's local_sum the gradient group.size() / count (Megatron-core
// multiplies the loss by the CP size): the mean of the members' parameter gradients over the
// data x context group, which the gradient reduction takes, is then the gradient of the loss.
Tensor context_parallel_mean_loss(const Tensor& local_sum, int64_t local_count,
                                  Communicator& group);
// The same for a loss summed over the tokens: sum over the group, backward scaled by size().
Tensor context_parallel_sum_loss(const Tensor& local_sum, Communicator& group);

}  // namespace nxd
