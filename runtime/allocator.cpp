#include "nxd/runtime/allocator.h"

#include <cstdlib>
#include <new>

#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"

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

std::shared_ptr<Storage> Storage::allocate(int64_t nbytes, Device device) {
  NXD_CHECK(nbytes >= 0, "[alloc] negative size ", nbytes);
  std::shared_ptr<Storage> s(new Storage());
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->rank_counter_ = current_context().memory_ptr();
  // The rank counter enforces capacity: charge it first so a failure leaves nothing charged.
  s->rank_counter_->allocate(nbytes);
  device_memory(device).allocate(nbytes);
  s->counted_ = true;
  if (device == Device::host && nbytes > 0) {
    size_t n = (static_cast<size_t>(nbytes) + 63) & ~size_t(63);
    s->data_ = std::aligned_alloc(64, n);
    if (!s->data_) throw std::bad_alloc();
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

Storage::~Storage() {
  if (deleter_)
    deleter_(data_);
  else if (counted_ && device_ == Device::host)
    std::free(data_);
  if (counted_) {
    device_memory(device_).release(nbytes_);
    rank_counter_->release(nbytes_);
  }
}

}  // namespace nxd
