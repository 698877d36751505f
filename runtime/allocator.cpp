#include "nxd/runtime/allocator.h"

#include "nxd/runtime/host_memory.h"

#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

const char* device_name(Device d) {
  return d == Device::host ? "host" : "meta";
}

static std::string human(int64_t b) {
  char buf[64];
  if (b >= (1ll << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ll << 30));
  else if (b >= (1ll << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ll << 20));
  else
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  return buf;
}

void MemoryCounter::allocate(int64_t bytes) {
  int64_t cap = capacity();
  int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (cap > 0 && now > cap) {
    live_.fetch_sub(bytes, std::memory_order_relaxed);
    throw OutOfDeviceMemory(str("[alloc] out of device memory on ", name_, ": requested ", bytes,
                                " bytes (", human(bytes), ") with ", now - bytes, " bytes (",
                                human(now - bytes), ") in use of capacity ", cap, " (", human(cap),
                                ")"));
  }
  int64_t p = peak_.load(std::memory_order_relaxed);
  while (now > p && !peak_.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
  }
}

MemoryCounter& device_memory(Device d) {
  static MemoryCounter host("host"), meta("meta");
  return d == Device::host ? host : meta;
}

// Host blocks are cached by rounded size so a training step that allocates the same shapes every
// iteration reuses memory instead of mapping and faulting fresh pages (large blocks come from mmap
// and return to the OS on free). The cache holds at most NXD_HOST_CACHE_MB (default 1024) MiB.
// Under AddressSanitizer nothing is cached, so use-after-free is still caught.
namespace {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCacheEnabled = false;
#else
constexpr bool kCacheEnabled = true;
#endif

struct HostCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> blocks;
  size_t cached = 0;
  size_t limit;
  HostCache() {
    const char* e = std::getenv("NXD_HOST_CACHE_MB");
    limit = (e ? static_cast<size_t>(std::atoll(e)) : 1024) << 20;
  }
  ~HostCache() { release(); }
  void release() {
    std::lock_guard lk(mu);
    for (auto& [n, v] : blocks)
      for (void* p : v) std::free(p);
    blocks.clear();
    cached = 0;
  }
};
HostCache& host_cache() {
  static HostCache* c = new HostCache();  // never destroyed: storages may outlive statics
  return *c;
}
std::atomic<int64_t> g_storages{0}, g_fresh{0}, g_fresh_bytes{0}, g_reused{0};

size_t rounded(size_t n) {
  return n <= 4096 ? (n + 63) & ~size_t(63) : (n + 4095) & ~size_t(4095);
}

void* host_alloc(size_t n) {
  n = rounded(n);
  if (kCacheEnabled) {
    HostCache& c = host_cache();
    std::lock_guard lk(c.mu);
    auto it = c.blocks.find(n);
    if (it != c.blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= n;
      g_reused.fetch_add(1, std::memory_order_relaxed);
      return p;
    }
  }
  void* p = std::aligned_alloc(64, n);
  if (!p) throw std::bad_alloc();
  g_fresh.fetch_add(1, std::memory_order_relaxed);
  g_fresh_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  return p;
}

void host_free(void* p, size_t n) {
  n = rounded(n);
  if (kCacheEnabled) {
    HostCache& c = host_cache();
    std::lock_guard lk(c.mu);
    if (c.cached + n <= c.limit) {
      c.blocks[n].push_back(p);
      c.cached += n;
      return;
    }
  }
  std::free(p);
}
}  // namespace

AllocStats alloc_stats() {
  return {g_storages.load(std::memory_order_relaxed), g_fresh.load(std::memory_order_relaxed),
          g_fresh_bytes.load(std::memory_order_relaxed), g_reused.load(std::memory_order_relaxed)};
}

void release_host_cache() {
  host_cache().release();
}

int64_t host_cache_bytes() {
  std::lock_guard lk(host_cache().mu);
  return static_cast<int64_t>(host_cache().cached);
}

int64_t host_ram_bytes() {
  static const int64_t ram = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  return ram;
}

namespace {

// The host cannot hold `nbytes` more: an OutOfDeviceMemory naming the rank's counter, the request,
// what the rank and the process hold, the rank's (device) capacity and the machine's RAM.
[[noreturn]] void host_out_of_memory(const MemoryCounter& rank, int64_t nbytes, const char* why) {
  const int64_t cap = rank.capacity();
  throw OutOfDeviceMemory(str("[alloc] out of host memory on ", rank.name(), ": requested ", nbytes,
                              " bytes (", human(nbytes), ") with ", human(rank.live()),
                              " in use on this rank", cap > 0 ? " of capacity " + human(cap) : "",
                              " and ", human(device_memory(Device::host).live()),
                              " by every rank of this process; the machine has ",
                              human(host_ram_bytes()), " of RAM (", why, ")"));
}

}  // namespace

void check_scratch(int64_t bytes, const char* what) {
  const MemoryCounter& rank = current_context().memory();
  const int64_t cap = rank.capacity();
  if (cap > 0 && rank.live() + bytes > cap)
    throw OutOfDeviceMemory(str("[alloc] out of device memory on ", rank.name(), ": ", what,
                                " needs ", bytes, " bytes (", human(bytes), ") with ",
                                human(rank.live()), " in use of capacity ", cap, " (", human(cap),
                                ")"));
  if (device_memory(Device::host).live() + bytes > host_ram_bytes())
    host_out_of_memory(rank, bytes, what);
}

std::shared_ptr<Storage> Storage::allocate(int64_t nbytes, Device device) {
  NXD_CHECK(nbytes >= 0, "[alloc] negative size ", nbytes);
  if (device == Device::host)
    if (PlacementSlot* p = current_context().find_ext<PlacementSlot>();
        p && p->armed && p->nbytes == nbytes) {
      p->armed = false;
      return wrap(p->data, nbytes, [](void*) {});
    }
  // Tensors beyond the machine's RAM would only be granted by overcommit and then get the
  // process killed when touched: refuse them with the numbers instead.
  if (device == Device::host && device_memory(Device::host).live() + nbytes > host_ram_bytes())
    host_out_of_memory(current_context().memory(), nbytes, "more than the RAM");
  std::shared_ptr<Storage> s(new Storage());
  g_storages.fetch_add(1, std::memory_order_relaxed);
  s->nbytes_ = nbytes;
  s->device_ = device;
  // the rank's device counter, or its host counter inside a HostMemoryScope (host_memory.h)
  s->rank_counter_ = detail::host_memory_if_scoped();
  if (!s->rank_counter_) s->rank_counter_ = current_context().memory_ptr();
  // The rank counter enforces capacity: charge it first so a failure leaves nothing charged.
  s->rank_counter_->allocate(nbytes);
  device_memory(device).allocate(nbytes);
  s->counted_ = true;
  if (device == Device::host && nbytes > 0) {
    try {
      s->data_ = host_alloc(static_cast<size_t>(nbytes));
    } catch (const std::bad_alloc&) {
      host_out_of_memory(*s->rank_counter_, nbytes, "the allocation failed");
    }
  }
  return s;
}

std::shared_ptr<Storage> Storage::wrap(void* data, int64_t nbytes,
                                       std::function<void(void*)> deleter) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->deleter_ = std::move(deleter);
  return s;
}

void Storage::release_data() {
  NXD_CHECK(counted_ && !deleter_, "[alloc] release_data on a storage not allocated here");
  if (released_) return;
  if (device_ == Device::host && data_) host_free(data_, static_cast<size_t>(nbytes_));
  data_ = nullptr;
  device_memory(device_).release(nbytes_);
  rank_counter_->release(nbytes_);
  released_ = true;
}

void Storage::reallocate() {
  if (!released_) return;
  if (device_ == Device::host && device_memory(Device::host).live() + nbytes_ > host_ram_bytes())
    host_out_of_memory(current_context().memory(), nbytes_, "more than the RAM");
  rank_counter_ = detail::host_memory_if_scoped();
  if (!rank_counter_) rank_counter_ = current_context().memory_ptr();
  rank_counter_->allocate(nbytes_);
  device_memory(device_).allocate(nbytes_);
  if (device_ == Device::host && nbytes_ > 0) {
    try {
      data_ = host_alloc(static_cast<size_t>(nbytes_));
    } catch (const std::bad_alloc&) {
      device_memory(device_).release(nbytes_);
      rank_counter_->release(nbytes_);
      host_out_of_memory(*rank_counter_, nbytes_, "the allocation failed");
    }
  }
  released_ = false;
}

Storage::~Storage() {
  if (deleter_)
    deleter_(data_);
  else if (counted_ && device_ == Device::host && data_)
    host_free(data_, static_cast<size_t>(nbytes_));
  if (counted_ && !released_) {
    device_memory(device_).release(nbytes_);
    rank_counter_->release(nbytes_);
  }
}

}  // namespace nxd
