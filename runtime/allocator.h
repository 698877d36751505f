#pragma once
// Memory accounting. Every tensor's bytes are charged to two counters: the process-wide counter
// of its device (host or meta) and the counter of the rank (Context) that allocated it. A rank's
// counter may have a capacity (the sim backend sets it to the NeuronCore's HBM); exceeding it
// throws OutOfDeviceMemory. Meta tensors allocate nothing but are counted, so the planner can
// read the memory a model would need.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace nxd {

enum class Device : uint8_t { host, meta };
const char* device_name(Device d);

class MemoryCounter {
 public:
  explicit MemoryCounter(std::string name, int64_t capacity = 0)
      : name_(std::move(name)), capacity_(capacity) {}
  // Throws OutOfDeviceMemory naming the counter, the request, bytes in use and the capacity.
  void allocate(int64_t bytes);
  void release(int64_t bytes) { live_.fetch_sub(bytes, std::memory_order_relaxed); }
  int64_t live() const { return live_.load(std::memory_order_relaxed); }
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  int64_t capacity() const { return capacity_.load(std::memory_order_relaxed); }  // 0: unlimited
  void set_capacity(int64_t bytes) { capacity_ = bytes; }
  void reset_peak() { peak_ = live(); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::atomic<int64_t> capacity_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

// Process-wide counters per device.
MemoryCounter& device_memory(Device d);

// The machine's physical memory. A host tensor that would take the process's host tensors past it
// throws OutOfDeviceMemory (as does a failed allocation), naming the rank, the request and the
// capacities, instead of std::bad_alloc or the kernel's OOM killer.
int64_t host_ram_bytes();
// For a kernel's temporary host buffer (not a tensor, so not charged): throws OutOfDeviceMemory,
// naming `what`, when `bytes` exceed what the current rank has left of its capacity or the
// machine's RAM — before the allocation fails with std::bad_alloc or overcommits.
void check_scratch(int64_t bytes, const char* what);

// Allocation counters (process-wide, every rank): storages allocated (tensors on any device),
// and of the host blocks behind them those served fresh by the system allocator (cache misses)
// or reused from the cache below. A loop that allocates the same shapes every iteration shows
// fresh == 0 per iteration once warm (e.g. a decode step).
struct AllocStats {
  int64_t storages = 0;    // Storage::allocate calls
  int64_t host_fresh = 0;  // host blocks from aligned_alloc
  int64_t host_fresh_bytes = 0;
  int64_t host_reused = 0;  // host blocks from the cache
};
AllocStats alloc_stats();

// Frees the host blocks kept for reuse (live tensors are unaffected).
void release_host_cache();
int64_t host_cache_bytes();

// A block of bytes on a device. Host blocks are 64-byte aligned and uninitialized.
class Storage {
 public:
  // Allocates on `device`, charging the device counter and the current Context's counter.
  static std::shared_ptr<Storage> allocate(int64_t nbytes, Device device);
  // Wraps memory owned elsewhere (not counted); `deleter` runs when the last tensor goes.
  static std::shared_ptr<Storage> wrap(void* data, int64_t nbytes,
                                       std::function<void(void*)> deleter = nullptr);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  int64_t nbytes() const { return nbytes_; }
  // ZeRO-3 (optim/zero1.h): frees the block of an allocated storage, uncharging its counters,
  // while the Storage (and every tensor viewing it) lives on; reallocate() gives it a fresh
  // uninitialized block of the same size charged to the current Context (PyTorch FSDP's
  // storage().resize_(0) and back). has_data(): not released.
  void release_data();
  void reallocate();
  bool has_data() const { return !released_; }
  Device device() const { return device_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  int64_t nbytes_ = 0;
  Device device_ = Device::host;
  std::shared_ptr<MemoryCounter> rank_counter_;  // keeps the rank's counter alive until freed
  std::function<void(void*)> deleter_;
  bool counted_ = false;
  bool released_ = false;
};

}  // namespace nxd
