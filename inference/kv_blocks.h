#pragma once
// The block pool of the paged KV cache and its prefix cache (docs/design/inference.md).
//
// The pool has num_blocks blocks of block_size positions. A sequence owns a block table (its
// blocks in position order). A block that is full is registered under the chain hash of the
// sequence's tokens up to its end (hash(parent block's hash, this block's tokens)), so another
// sequence whose tokens begin the same way takes it (refcount + 1) instead of computing it. Blocks
// no sequence holds wait in a free queue in the order they were freed; allocation takes the
// front (least recently used) and forgets its hash then (LRU eviction). A hit on a free cached
// block takes it back out of the queue. Under a sliding window a sequence returns the blocks no
// later query reads while it runs (release_before), so it holds about window / block_size blocks
// however long it grows.
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace nxd::inference {

class BlockPool {
 public:
  BlockPool(int64_t num_blocks, int64_t block_size, bool prefix_caching);
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks() - free_blocks(); }
  int64_t blocks_for(int64_t positions) const {
    return (positions + block_size_ - 1) / block_size_;
  }

  // The cached full blocks that begin `tokens`, at most (tokens.size() - 1) / block_size of them
  // (the last token is always computed: its logits are needed). Does not take them.
  std::vector<int64_t> lookup(const std::vector<int64_t>& tokens) const;
  // Whether `table` (holding `hits` just looked up, not yet taken) can grow to cover `positions`.
  bool can_grow(const std::vector<int64_t>& table, const std::vector<int64_t>& hits,
                int64_t positions) const;
  // Takes the hits (refcount + 1) into an empty table.
  void take(std::vector<int64_t>& table, const std::vector<int64_t>& hits);
  // Appends free blocks until table covers `positions`; false (nothing taken) if too few.
  bool grow(std::vector<int64_t>& table, int64_t positions);
  // Registers the full blocks of `table` among the first `computed` positions of `tokens` that
  // are not yet registered (blocks [0, registered) already are); returns the new count.
  int64_t register_full(const std::vector<int64_t>& table, const std::vector<int64_t>& tokens,
                        int64_t computed, int64_t registered);
  // Returns the table's blocks (refcount - 1; the last block first into the free queue, so a
  // sequence's tail is evicted before its prefix) and clears it. Entries of -1 (blocks already
  // returned by release_before) are skipped.
  void release(std::vector<int64_t>& table);
  // Returns the blocks of `table` past the first blocks_for(positions) (speculative decoding's
  // rejected positions; such blocks were never registered), last first.
  void truncate(std::vector<int64_t>& table, int64_t positions);
  // A rolling sliding window: returns the blocks wholly before position `first_needed` (the
  // first position any later query of the sequence reads) and marks their entries -1. With prefix
  // caching the last of the `registered` blocks is kept (the next block's chain hash starts from
  // it). Returns how many blocks it returned.
  int64_t release_before(std::vector<int64_t>& table, int64_t first_needed, int64_t registered);

 private:
  struct Block {
    int64_t refs = 0;
    bool cached = false;
    uint64_t hash = 0;
    std::vector<int64_t> tokens;       // the whole prefix's tokens are checked through the chain
    std::list<int64_t>::iterator pos;  // in free_ while refs == 0
  };
  uint64_t chain(uint64_t parent, const int64_t* tokens) const;
  void evict(int64_t b);
  int64_t block_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  std::list<int64_t> free_;
  std::unordered_map<uint64_t, int64_t> by_hash_;
};

}  // namespace nxd::inference
