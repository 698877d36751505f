#include "nxd/layers/models/kv_cache.h"

#include <algorithm>

#include "nxd/runtime/error.h"

namespace nxd {

int64_t KVCache::nbytes() const {
  int64_t n = 0;
  for (const auto& t : k) n += t.nbytes();
  for (const auto& t : v) n += t.nbytes();
  return n;
}

CacheStep make_cache_step(const std::vector<int64_t>& seq_ids, const std::vector<int64_t>& start,
                          const std::vector<int64_t>& lengths, Device device) {
  const int64_t B = static_cast<int64_t>(seq_ids.size());
  NXD_CHECK_SHAPE(
      B > 0 && static_cast<int64_t>(start.size()) == B && static_cast<int64_t>(lengths.size()) == B,
      "[make_cache_step] seq_ids, start and lengths need the same B > 0 rows, got ", seq_ids.size(),
      ", ", start.size(), ", ", lengths.size());
  if (device == Device::meta)
    return {empty({B}, DType::i64, Device::meta), empty({B}, DType::i64, Device::meta),
            empty({B}, DType::i64, Device::meta)};
  return {from_vector<int64_t>(seq_ids, {B}), from_vector<int64_t>(start, {B}),
          from_vector<int64_t>(lengths, {B})};
}

CacheStep make_paged_cache_step(const std::vector<std::vector<int64_t>>& tables,
                                const std::vector<int64_t>& start,
                                const std::vector<int64_t>& lengths) {
  const int64_t B = static_cast<int64_t>(tables.size());
  NXD_CHECK_SHAPE(
      B > 0 && static_cast<int64_t>(start.size()) == B && static_cast<int64_t>(lengths.size()) == B,
      "[make_paged_cache_step] tables, start and lengths need the same B > 0 rows, got ",
      tables.size(), ", ", start.size(), ", ", lengths.size());
  size_t mb = 1;
  for (const auto& t : tables) mb = std::max(mb, t.size());
  std::vector<int64_t> flat(B * mb, -1);
  for (int64_t b = 0; b < B; ++b)
    std::copy(tables[b].begin(), tables[b].end(), flat.begin() + b * mb);
  CacheStep s;
  s.seq_ids = from_vector<int64_t>(std::vector<int64_t>(B, 0), {B});
  s.start = from_vector<int64_t>(start, {B});
  s.lengths = from_vector<int64_t>(lengths, {B});
  s.block_tables = from_vector<int64_t>(flat, {B, static_cast<int64_t>(mb)});
  return s;
}

}  // namespace nxd
