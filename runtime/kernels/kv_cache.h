#pragma once
// Kernels of the KV-cache (inference) path: each batch row b has its own positions. With
//   seq_ids[b]  the cache row batch row b reads and writes (continuous batching),
//   start[b]    the position of its first token (the cache row holds positions [0, start[b])),
//   lengths[b]  its real tokens (1..S; the rest of the row is padding),
// token s < lengths[b] of row b sits at position p = start[b] + s. All three are i64 [B], host
// tensors for host outputs (values are read) or meta with meta outputs (shapes only).
//
// Costs charged to the sim device (charge_compute): the cache write moves the new K/V bytes only;
// attention reads the whole cache length L of each row when S == 1 (a decode step: NxD
// Inference's token-generation graph attends its whole cache bucket, masked) and S keys when
// S > 1 (a prefill: the context-encoding graph attends the prompt only).
#include <cstdint>

#include "nxd/runtime/rope_scaling.h"
#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// Process-wide counters of the cache kernels (atomic): bytes written into caches by
// kv_cache_write, and bytes of cache rows read by cached_attention_forward.
struct KVCacheCounters {
  int64_t bytes_written = 0;
  int64_t writes = 0;
  int64_t bytes_read = 0;
};
KVCacheCounters kv_cache_counters();

// cache [Bmax, H, L, D] contiguous, written in place: cache[seq_ids[b], h, start[b] + s, :] =
// x[b, h, s, :] for s < lengths[b] (nothing else is touched). x [B, H, S, D] of the cache's dtype
// (any dtype), unit last stride. seq_ids must be distinct and in [0, Bmax); start[b] >= 0,
// 1 <= lengths[b] <= S, start[b] + lengths[b] <= L.
void kv_cache_write(const Tensor& cache, const Tensor& x, const Tensor& seq_ids,
                    const Tensor& start, const Tensor& lengths);

// rotary_forward (rotary.h) with the position of (b, s) = start[b] + s. y, x [B, H, S, D] f32 or
// f64, unit last stride.
void rotary_at_forward(const Tensor& y, const Tensor& x, const Tensor& start, int64_t rotary_dim,
                       double base, const RopeScaling& scaling = {});

// out [B, Hq, S, D] (unit last stride) = softmax(scale q k^T) v over the cache: query (b, h, s)
// at position p = start[b] + s attends positions [0, p] of cache row seq_ids[b], kv head
// h / (Hq / Hkv). Padding queries (s >= lengths[b]) get zeros. q f32/f64 [B, Hq, S, D];
// k_cache, v_cache [Bmax, Hkv, L, D] contiguous, q's dtype or bf16 (loaded to f32).
// scale <= 0 means 1/sqrt(D). window > 0: a sliding window, positions (p - window, p] only.
// Call kv_cache_write for the step's tokens first.
void cached_attention_forward(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                              const Tensor& v_cache, const Tensor& seq_ids, const Tensor& start,
                              const Tensor& lengths, double scale, int64_t window = 0);

// The first cache position a row whose first query sits at `start` reads: under a sliding window
// (window > 0) that query's window start, max(0, start - window + 1); 0 without one. Both
// attention kernels read the keys from there on (the masks are relative, so this changes no
// result), and the paged one reads no block wholly before it: an engine may return such blocks to
// its pool (a rolling window).
inline int64_t first_key_needed(int64_t start, int64_t window) {
  return window > 0 && start - window + 1 > 0 ? start - window + 1 : 0;
}

// The paged layout (vLLM's PagedAttention): cache [num_blocks, H, block_size, D] contiguous, one
// pool of fixed-size blocks; block_tables i64 [B, max_blocks] (contiguous host, or meta): position
// p of batch row b lives in block block_tables[b, p / block_size] at offset p % block_size. Rows
// may share blocks (a shared prefix is read by several rows); entries past a row's last position
// are not read, nor those of blocks wholly before first_key_needed(start, window) (may be -1).
//
// kv_cache_write into the paged layout: the K/V of positions [start[b], start[b] + lengths[b]).
// Blocks written by a step must not be shared with another row of the step.
void paged_kv_cache_write(const Tensor& cache, const Tensor& x, const Tensor& block_tables,
                          const Tensor& start, const Tensor& lengths);
// cached_attention_forward reading the paged layout through block_tables: each (row, kv head)
// gathers its n = start + len keys and values from their blocks into a per-thread scratch and
// runs the contiguous kernel's GEMMs on it, so the result is bitwise the contiguous one.
void paged_attention_forward(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                             const Tensor& v_cache, const Tensor& block_tables, const Tensor& start,
                             const Tensor& lengths, double scale, int64_t window = 0);

// out [B, H] = h[b, lengths[b] - 1, :] for h [B, S, H] (any dtype; out of h's dtype).
void gather_last_forward(const Tensor& out, const Tensor& h, const Tensor& lengths);

namespace ref {
// Plain loops in double (tests).
void cached_attention_forward(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                              const Tensor& v_cache, const Tensor& seq_ids, const Tensor& start,
                              const Tensor& lengths, double scale, int64_t window = 0);
void rotary_at_forward(const Tensor& y, const Tensor& x, const Tensor& start, int64_t rotary_dim,
                       double base, const RopeScaling& scaling = {});
}  // namespace ref

}  // namespace nxd::kernels
