#pragma once
// The sim device's host memory, accounted apart from its device memory (HBM): tensors allocated
// while a HostMemoryScope is open on this rank charge the rank's host counter (host_memory())
// instead of Context::memory(), the device's, and release it when freed. Optimizer offload
// (optim/zero1.h, docs/design/fsdp.md) keeps the sharded optimizer state and master weights
// there. The counter has no capacity: the machine's RAM bounds every host tensor already
// (allocator.h).
#include <memory>

#include "nxd/runtime/allocator.h"

namespace nxd {

// The current rank's host counter ("rank <r> host"), created on first use.
MemoryCounter& host_memory();

// RAII: allocations on this rank charge host_memory() for its lifetime (nests); with
// HostPlacement::off it does nothing (a scope that depends on a setting).
enum class HostPlacement { off, on };
class HostMemoryScope {
 public:
  explicit HostMemoryScope(HostPlacement p = HostPlacement::on);
  ~HostMemoryScope();
  HostMemoryScope(const HostMemoryScope&) = delete;
  HostMemoryScope& operator=(const HostMemoryScope&) = delete;

 private:
  bool on_;
};

namespace detail {
// The counter an allocation on this rank charges now: host_memory()'s inside a HostMemoryScope,
// null outside (the caller then charges Context::memory()).
std::shared_ptr<MemoryCounter> host_memory_if_scoped();
}  // namespace detail

}  // namespace nxd
