#pragma once
// The KV cache of a CausalLM and the per-row positions of one cached forward (the contract the
// tracer builds on; docs/design/generation.md "KV cache and generation").
//
//   KVCache: one K and one V per decoder layer, each [max_batch, kv_heads_local, max_len,
//   head_dim] in the model's dtype on the model's device (kv_heads_local: this TP rank's K/V
//   heads), allocated once by CausalLM::make_kv_cache and written in place by forward_cached.
//   CacheStep: for ids [B, S] (rows right-padded),
//     seq_ids i64 [B]  the cache row batch row b uses (continuous batching: requests keep their
//                      row while others join and leave),
//     start   i64 [B]  the position of ids[b, 0]; the cache row holds positions [0, start[b]),
//     lengths i64 [B]  real tokens of row b (1..S); the rest is padding and writes nothing.
//   Prefill: S = the prompt (bucket) length, start = 0. Decode: S = 1, lengths = 1.
//
//   The paged layout (vLLM's PagedAttention; inference/ schedules it): KVCache::block_size > 0,
//   each K and V [num_blocks, kv_heads_local, block_size, head_dim], one pool of blocks; the
//   CacheStep then carries block_tables i64 [B, max_blocks]: position p of row b lives in block
//   block_tables[b, p / block_size] (seq_ids is unused). Attention reads through the table, so a
//   sequence grows by taking a block, without copying, and rows may share prefix blocks.
#include <cstdint>
#include <vector>

#include "nxd/runtime/tensor.h"

namespace nxd {

struct KVCache {
  int64_t max_batch = 0, max_len = 0;
  int64_t block_size = 0;    // > 0: paged (max_batch is then the number of blocks)
  std::vector<Tensor> k, v;  // per decoder layer
  int64_t nbytes() const;    // bytes of all K and V tensors
};

struct CacheStep {
  Tensor seq_ids;
  Tensor start;
  Tensor lengths;
  Tensor block_tables;  // defined: the paged layout (i64 [B, max_blocks])
};

// A CacheStep from host values (i64 [B] each); `device` meta gives meta tensors (shapes only).
CacheStep make_cache_step(const std::vector<int64_t>& seq_ids, const std::vector<int64_t>& start,
                          const std::vector<int64_t>& lengths, Device device = Device::host);

// A CacheStep of the paged layout: row b's block table is tables[b] (padded with -1 to the
// longest; entries a row does not reach are never read).
CacheStep make_paged_cache_step(const std::vector<std::vector<int64_t>>& tables,
                                const std::vector<int64_t>& start,
                                const std::vector<int64_t>& lengths);

}  // namespace nxd
