#include "nxd/runtime/host_memory.h"

#include <string>

#include "nxd/runtime/context.h"

namespace nxd {

namespace {
struct HostMemorySlot {
  std::shared_ptr<MemoryCounter> counter;
  int depth = 0;
};
HostMemorySlot& slot() {
  Context& ctx = current_context();
  HostMemorySlot& s = ctx.ext<HostMemorySlot>();
  if (!s.counter)
    s.counter = std::make_shared<MemoryCounter>("rank " + std::to_string(ctx.rank()) + " host");
  return s;
}
}  // namespace

MemoryCounter& host_memory() {
  return *slot().counter;
}

HostMemoryScope::HostMemoryScope(HostPlacement p) : on_(p == HostPlacement::on) {
  if (on_) ++slot().depth;
}
HostMemoryScope::~HostMemoryScope() {
  if (on_) --slot().depth;
}

namespace detail {
std::shared_ptr<MemoryCounter> host_memory_if_scoped() {
  const HostMemorySlot* s = current_context().find_ext<HostMemorySlot>();
  return s && s->depth > 0 ? s->counter : nullptr;
}
}  // namespace detail

}  // namespace nxd
