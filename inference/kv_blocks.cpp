// The paged KV cache's block pool and prefix cache (kv_blocks.h).
#include "nxd/inference/kv_blocks.h"

#include <algorithm>

#include "nxd/runtime/error.h"

namespace nxd::inference {

BlockPool::BlockPool(int64_t num_blocks, int64_t block_size, bool prefix_caching)
    : block_size_(block_size), prefix_caching_(prefix_caching), blocks_(num_blocks) {
  NXD_CHECK(num_blocks >= 1 && block_size >= 1, "[BlockPool] need num_blocks >= 1 and ",
            "block_size >= 1, got ", num_blocks, " and ", block_size);
  for (int64_t b = 0; b < num_blocks; ++b) blocks_[b].pos = free_.insert(free_.end(), b);
}

uint64_t BlockPool::chain(uint64_t parent, const int64_t* tokens) const {
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;  // FNV-1a over the parent and the token ids
  for (int64_t i = 0; i < block_size_; ++i) {
    uint64_t t = static_cast<uint64_t>(tokens[i]);
    for (int k = 0; k < 8; ++k, t >>= 8) h = (h ^ (t & 0xff)) * 0x100000001b3ull;
  }
  return h;
}

std::vector<int64_t> BlockPool::lookup(const std::vector<int64_t>& tokens) const {
  std::vector<int64_t> hits;
  if (!prefix_caching_ || tokens.empty()) return hits;
  const int64_t n = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  uint64_t h = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* t = tokens.data() + i * block_size_;
    h = chain(h, t);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const Block& b = blocks_[it->second];
    // a hash collision must not hand out another prefix's K/V: the tokens are compared (the
    // parent blocks were compared before)
    if (!std::equal(b.tokens.begin(), b.tokens.end(), t)) break;
    hits.push_back(it->second);
  }
  return hits;
}

bool BlockPool::can_grow(const std::vector<int64_t>& table, const std::vector<int64_t>& hits,
                         int64_t positions) const {
  int64_t free_hits = 0;
  for (int64_t b : hits) free_hits += blocks_[b].refs == 0;
  const int64_t have = static_cast<int64_t>(table.size() + hits.size());
  return blocks_for(positions) - have <= free_blocks() - free_hits;
}

void BlockPool::take(std::vector<int64_t>& table, const std::vector<int64_t>& hits) {
  NXD_INTERNAL_CHECK(table.empty(), "prefix hits go into an empty table");
  for (int64_t b : hits) {
    Block& blk = blocks_[b];
    if (blk.refs++ == 0) free_.erase(blk.pos);
    table.push_back(b);
  }
}

void BlockPool::evict(int64_t b) {
  Block& blk = blocks_[b];
  if (!blk.cached) return;
  auto it = by_hash_.find(blk.hash);
  if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
  blk.cached = false;
  blk.tokens.clear();
}

bool BlockPool::grow(std::vector<int64_t>& table, int64_t positions) {
  const int64_t need = blocks_for(positions) - static_cast<int64_t>(table.size());
  if (need > free_blocks()) return false;
  for (int64_t i = 0; i < need; ++i) {
    const int64_t b = free_.front();
    free_.pop_front();
    evict(b);
    blocks_[b].refs = 1;
    table.push_back(b);
  }
  return true;
}

int64_t BlockPool::register_full(const std::vector<int64_t>& table,
                                 const std::vector<int64_t>& tokens, int64_t computed,
                                 int64_t registered) {
  if (!prefix_caching_) return registered;
  const int64_t full = std::min<int64_t>(computed / block_size_, table.size());
  uint64_t h = registered > 0 ? blocks_[table[registered - 1]].hash : 0;
  for (int64_t i = registered; i < full; ++i) {
    const int64_t* t = tokens.data() + i * block_size_;
    h = chain(h, t);
    Block& blk = blocks_[table[i]];
    if (!blk.cached) {
      blk.cached = true;
      blk.hash = h;
      blk.tokens.assign(t, t + block_size_);
      by_hash_.emplace(h, table[i]);  // an equal block already registered keeps its place
    }
  }
  return std::max(registered, full);
}

void BlockPool::release(std::vector<int64_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    if (*it < 0) continue;  // returned by release_before
    Block& blk = blocks_[*it];
    NXD_INTERNAL_CHECK(blk.refs > 0, "block ", *it, " released more often than taken");
    if (--blk.refs == 0) blk.pos = free_.insert(free_.end(), *it);
  }
  table.clear();
}

void BlockPool::truncate(std::vector<int64_t>& table, int64_t positions) {
  while (static_cast<int64_t>(table.size()) > blocks_for(positions)) {
    const int64_t b = table.back();
    table.pop_back();
    if (b < 0) continue;
    Block& blk = blocks_[b];
    NXD_INTERNAL_CHECK(blk.refs > 0 && !blk.cached, "block ", b, " past position ", positions,
                       " is registered or free");
    if (--blk.refs == 0) blk.pos = free_.insert(free_.end(), b);
  }
}

int64_t BlockPool::release_before(std::vector<int64_t>& table, int64_t first_needed,
                                  int64_t registered) {
  int64_t end = std::min<int64_t>(first_needed / block_size_, table.size());
  if (prefix_caching_) end = std::min<int64_t>(end, registered - 1);
  int64_t n = 0;
  for (int64_t i = 0; i < end; ++i) {
    if (table[i] < 0) continue;
    Block& blk = blocks_[table[i]];
    NXD_INTERNAL_CHECK(blk.refs > 0, "block ", table[i], " released more often than taken");
    if (--blk.refs == 0) blk.pos = free_.insert(free_.end(), table[i]);
    table[i] = -1;
    ++n;
  }
  return n;
}

}  // namespace nxd::inference
