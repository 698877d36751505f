#pragma once
// The ops of the KV-cache (inference) path: ordinary nxd ops (free functions) that run forward
// only, without a graph; each throws naming itself if an input requires grad (run them under
// NoGradGuard). Per-row positions: see runtime/kernels/kv_cache.h (seq_ids, start, lengths: i64
// [B]; token s < lengths[b] of batch row b sits at position start[b] + s and uses cache row
// seq_ids[b]). Inputs may be bf16 (computed in f32, rounded once), f32 or f64, host or meta.
#include "nxd/autograd/ops/nn.h"

namespace nxd {

// Writes x [B, H, S, D] (the cache's dtype) into cache [Bmax, H, L, D] in place at positions
// [start[b], start[b] + lengths[b]) of row seq_ids[b]; padding tokens write nothing. No copy of
// the cache is made.
void kv_cache_write(const Tensor& cache, const Tensor& x, const Tensor& seq_ids,
                    const Tensor& start, const Tensor& lengths);

// rotary (nn.h) with the position of x[b, :, s] = start[b] + s (opts.position_offset unused).
Tensor rotary_at(const Tensor& x, const Tensor& start, const RotaryOptions& opts);

// q [B, Hq, S, D] against the caches k_cache, v_cache [Bmax, Hkv, L, D] (Hkv divides Hq,
// grouped-query): query (b, h, s) attends positions [0, start[b] + s] of cache row seq_ids[b];
// padding queries give zeros. -> [B, Hq, S, D] in [B, S, Hq, D] memory (as
// scaled_dot_product_attention), q's dtype. scale <= 0: 1/sqrt(D). bf16 caches are read as they
// are (never converted whole).
Tensor cached_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& seq_ids, const Tensor& start, const Tensor& lengths,
                        double scale = 0.0);

// The paged cache (runtime/kernels/kv_cache.h): cache [num_blocks, H, block_size, D] and per-row
// block tables i64 [B, max_blocks]. kv_cache_write and cached_attention through the tables; the
// attention is bitwise the contiguous one for the same keys.
void paged_kv_cache_write(const Tensor& cache, const Tensor& x, const Tensor& block_tables,
                          const Tensor& start, const Tensor& lengths);
Tensor paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                       const Tensor& block_tables, const Tensor& start, const Tensor& lengths,
                       double scale = 0.0);

// h [B, S, H] -> [B, H]: each row's last real token, h[b, lengths[b] - 1].
Tensor gather_last(const Tensor& h, const Tensor& lengths);

}  // namespace nxd
