#include "nxd/layers/models/kv_cache.h"

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

}  // namespace nxd
