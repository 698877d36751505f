#pragma once
// The per-rank Context: rank, world size, RNG, memory counter, an optional cost model (the sim
// NeuronCore's clock) and typed extension slots that higher layers fill (collectives keeps the
// communicator and the parallel_state groups there). Nothing per-rank is a process global: in
// the sim backend every rank is a thread with its own Context, made current by a ContextGuard.
// Code that runs with no context set gets a default single-rank context for its thread.
#include <cstdint>
#include <memory>
#include <typeindex>
#include <unordered_map>

#include "nxd/runtime/allocator.h"
#include "nxd/runtime/dtype.h"
#include "nxd/runtime/rng.h"

namespace nxd {

// What a kernel costs on a modeled device. The sim backend implements it: it advances the
// rank's simulated clock by the roofline time of the kernel and records it on the timeline.
class CostModel {
 public:
  virtual ~CostModel() = default;
  // `flops` floating-point operations on `dtype`, moving `bytes` through device memory.
  virtual void charge_compute(const char* op, double flops, double bytes, DType dtype) = 0;
};

struct ContextOptions {
  int rank = 0;
  int world_size = 1;
  uint64_t seed = 0;
  int64_t memory_capacity = 0;  // bytes; 0 = unlimited
  std::string name;             // counter name; default "rank <r>"
};

class Context {
 public:
  explicit Context(ContextOptions opts = {});
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  uint64_t seed() const { return rng_.seed(); }

  // The rank's generator: dropout and other per-call randomness draw streams from it.
  Generator& rng() { return rng_; }

  MemoryCounter& memory() { return *memory_; }
  const std::shared_ptr<MemoryCounter>& memory_ptr() const { return memory_; }

  CostModel* cost_model() const { return cost_model_.get(); }
  void set_cost_model(std::shared_ptr<CostModel> m) { cost_model_ = std::move(m); }

  // Typed extension slots: ext<T>() returns the rank's T, default-constructed on first use.
  template <class T>
  T& ext() {
    auto& slot = ext_[std::type_index(typeid(T))];
    if (!slot) slot = std::make_shared<T>();
    return *static_cast<T*>(slot.get());
  }
  template <class T>
  T* find_ext() const {
    auto it = ext_.find(std::type_index(typeid(T)));
    return it == ext_.end() ? nullptr : static_cast<T*>(it->second.get());
  }
  template <class T>
  void set_ext(std::shared_ptr<T> v) {
    ext_[std::type_index(typeid(T))] = std::move(v);
  }

 private:
  int rank_, world_size_;
  Generator rng_;
  std::shared_ptr<MemoryCounter> memory_;
  std::shared_ptr<CostModel> cost_model_;
  std::unordered_map<std::type_index, std::shared_ptr<void>> ext_;
};

// The calling thread's current context (a default one if none was set).
Context& current_context();

// Makes `ctx` current on this thread for the guard's lifetime.
class ContextGuard {
 public:
  explicit ContextGuard(Context& ctx);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  Context* prev_;
};

// Charges a kernel to the current context's cost model, if it has one (no-op on plain host).
inline void charge_compute(const char* op, double flops, double bytes, DType dtype) {
  if (CostModel* m = current_context().cost_model()) m->charge_compute(op, flops, bytes, dtype);
}

// Compute threads. nxd sets BLAS's thread count explicitly, never leaving it to defaults:
// set_num_threads(n) is the one knob (process-wide, since OpenBLAS's pool is process-wide). The
// sim backend sets it to 1 while ranks run as threads so they do not oversubscribe the cores.
// The default is 1 unless NXD_NUM_THREADS is set.
void set_num_threads(int n);
int num_threads();
// Called by every entry point that may run BLAS; applies the default on first use.
void ensure_threads_initialized();

}  // namespace nxd
