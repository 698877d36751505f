#include "nxd/runtime/context.h"

#include <cstdlib>
#include <mutex>

#include "nxd/runtime/blas.h"

namespace nxd {

Context::Context(ContextOptions o)
    : rank_(o.rank),
      world_size_(o.world_size),
      rng_(o.seed),
      memory_(std::make_shared<MemoryCounter>(o.name.empty() ? str("rank ", o.rank) : o.name,
                                              o.memory_capacity)) {
  NXD_CHECK(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "[Context] rank ", o.rank,
            " out of range for world size ", o.world_size);
}

namespace {
thread_local Context* tl_current = nullptr;
thread_local std::unique_ptr<Context> tl_default;
}  // namespace

Context& current_context() {
  if (tl_current) return *tl_current;
  if (!tl_default) tl_default = std::make_unique<Context>(ContextOptions{.name = "host"});
  return *tl_default;
}

ContextGuard::ContextGuard(Context& ctx) : prev_(tl_current) {
  tl_current = &ctx;
}
ContextGuard::~ContextGuard() {
  tl_current = prev_;
}

namespace {
std::once_flag g_threads_once;
std::atomic<int> g_threads{0};
}  // namespace

void set_num_threads(int n) {
  NXD_CHECK(n >= 1, "[set_num_threads] need n >= 1, got ", n);
  std::call_once(g_threads_once, [] {});
  g_threads = n;
  blas::set_threads(n);
}

int num_threads() {
  ensure_threads_initialized();
  return g_threads;
}

void ensure_threads_initialized() {
  std::call_once(g_threads_once, [] {
    int n = 1;
    if (const char* e = std::getenv("NXD_NUM_THREADS")) n = std::max(1, std::atoi(e));
    g_threads = n;
    blas::set_threads(n);
  });
}

}  // namespace nxd
