#include "nxd/optim/grad_sync.h"

#include <unordered_map>

#include "nxd/autograd/graph.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"

namespace nxd::optim {

const char* grad_sync_mode_name(GradSyncMode m) {
  return m == GradSyncMode::overlap ? "overlap" : "at_step";
}

namespace {

struct Bucket {
  DType dtype = DType::f32;  // f32 (f32 and bf16 gradients) or f64
  bool meta = false;         // shapes only: the collective is charged but moves no data
  std::vector<int> params;   // indices into State::params, in bucket order
  std::vector<int64_t> offsets;
  int64_t grad_numel = 0;  // gradients; then one flag per parameter
  Tensor buf;
  int pending = 0;  // gradients still to arrive in this pass
  bool launched = false;
  Work work;
  int64_t bytes() const { return grad_numel * dtype_size(dtype); }
};

}  // namespace

struct GradSync::State {
  std::vector<NamedParam> params;
  std::vector<int> bucket_of, pos_in_bucket;
  std::vector<char> arrived;  // this pass
  std::vector<Bucket> buckets;
  GradSyncOptions opts;
  std::shared_ptr<Communicator> group;
  bool sync = true;
  int next_launch = 0;

  Tensor slot(int i) const {
    const Bucket& b = buckets[bucket_of[i]];
    const int k = pos_in_bucket[i];
    return b.buf.narrow(0, b.offsets[k], params[i].param.numel()).view(params[i].param.shape());
  }
  Tensor flags(const Bucket& b) const {
    return b.buf.narrow(0, b.grad_numel, static_cast<int64_t>(b.params.size()));
  }

  // Copies parameter i's current gradient (zeros if none) into its bucket slot.
  void copy_in(int i) {
    Bucket& b = buckets[bucket_of[i]];
    arrived[i] = 1;
    --b.pending;
    // the copy moves the gradient through device memory (read + write): the modeled cost
    charge_compute("dp_bucket_copy_in", 0, 2.0 * params[i].param.numel() * dtype_size(b.dtype),
                   b.dtype);
    if (b.meta) return;
    Tensor g = params[i].param.grad();
    Tensor s = slot(i);
    const bool has = g.defined() && !g.is_meta();
    if (has)
      s.copy_(g);
    else
      s.zero_();
    flags(b).narrow(0, pos_in_bucket[i], 1).fill_(has ? 1.0 : 0.0);
  }

  void launch(int bi) {
    Bucket& b = buckets[bi];
    const int64_t n = b.grad_numel + static_cast<int64_t>(b.params.size());
    void* p = b.meta ? nullptr : b.buf.raw_data();
    b.work = group->iall_reduce(p, p, n, b.dtype, ReduceOp::avg);
    b.launched = true;
  }

  // Launches, in bucket order, every complete bucket whose predecessors are launched.
  void launch_ready() {
    while (next_launch < static_cast<int>(buckets.size()) && buckets[next_launch].pending == 0)
      launch(next_launch++);
  }

  void on_ready(int i) {
    if (!sync || opts.mode != GradSyncMode::overlap) return;
    NXD_CHECK(!arrived[i], "[GradSync] the gradient of parameter '", params[i].name,
              "' became ready twice before finish() with sync on: run all but the last "
              "microbatch's backward under no_sync() / set_sync(false)");
    copy_in(i);
    launch_ready();
  }

  void reset() {
    std::fill(arrived.begin(), arrived.end(), 0);
    for (auto& b : buckets) {
      b.pending = static_cast<int>(b.params.size());
      b.launched = false;
      b.work = Work();
    }
    next_launch = 0;
  }

  void wait_all_noexcept() {
    for (auto& b : buckets)
      if (b.launched) try {
          b.work.wait();
        } catch (...) {
        }
  }
};

GradSync::GradSync(const Module& model, GradSyncOptions opts)
    : GradSync(
          [&] {
            std::vector<NamedParam> ps;
            for (auto& [n, t] : model.named_parameters()) ps.push_back({n, t});
            return ps;
          }(),
          std::move(opts)) {}

GradSync::GradSync(std::vector<NamedParam> params, GradSyncOptions opts)
    : s_(std::make_shared<State>()) {
  State& s = *s_;
  NXD_CHECK(opts.bucket_bytes > 0, "[GradSync] bucket_bytes must be > 0, got ", opts.bucket_bytes);
  s.group = opts.group ? opts.group : parallel_state::get_data_parallel_group_ptr();
  NXD_CHECK(s.group != nullptr, "[GradSync] no data-parallel group");
  s.opts = std::move(opts);
  s.params = std::move(params);
  const int n = static_cast<int>(s.params.size());
  std::unordered_map<const TensorImpl*, int> seen;
  for (int i = 0; i < n; ++i) {
    const NamedParam& p = s.params[i];
    NXD_CHECK(p.param.defined(), "[GradSync] parameter '", p.name, "' is undefined");
    NXD_CHECK(p.param.requires_grad() && autograd::is_leaf(p.param), "[GradSync] parameter '",
              p.name, "' (", p.param.desc(), ") is not a leaf that requires grad");
    NXD_CHECK(is_floating(p.param.dtype()), "[GradSync] parameter '", p.name, "' is ",
              p.param.desc(), ": gradients must be floating point");
    auto [it, fresh] = seen.emplace(p.param.impl(), i);
    NXD_CHECK(fresh, "[GradSync] the same tensor is listed twice: '", s.params[it->second].name,
              "' and '", p.name, "' (tied weights must be listed once)");
  }

  // Buckets: reverse registration order; an open bucket per reduction dtype (and per device
  // kind), closed once it holds bucket_bytes; bucket order = creation order.
  s.bucket_of.assign(n, -1);
  s.pos_in_bucket.assign(n, -1);
  s.arrived.assign(n, 0);
  std::unordered_map<int, int> open;  // key (dtype, meta) -> bucket index
  for (int i = n - 1; i >= 0; --i) {
    const Tensor& t = s.params[i].param;
    const DType rdt = t.dtype() == DType::f64 ? DType::f64 : DType::f32;
    const bool meta = t.is_meta();
    const int key = static_cast<int>(rdt) * 2 + (meta ? 1 : 0);
    auto it = open.find(key);
    if (it == open.end()) {
      s.buckets.push_back(Bucket{.dtype = rdt, .meta = meta});
      it = open.emplace(key, static_cast<int>(s.buckets.size()) - 1).first;
    }
    Bucket& b = s.buckets[it->second];
    s.bucket_of[i] = it->second;
    s.pos_in_bucket[i] = static_cast<int>(b.params.size());
    b.params.push_back(i);
    b.offsets.push_back(b.grad_numel);
    b.grad_numel += t.numel();
    if (b.bytes() >= s.opts.bucket_bytes) open.erase(it);
  }
  for (auto& b : s.buckets) {
    const int64_t total = b.grad_numel + static_cast<int64_t>(b.params.size());
    if (s.group->size() > 1) b.buf = zeros({total}, b.dtype, b.meta ? Device::meta : Device::host);
    b.pending = static_cast<int>(b.params.size());
  }
  if (s.group->size() == 1) return;  // nothing to average
  std::weak_ptr<State> weak = s_;
  for (int i = 0; i < n; ++i)
    autograd::register_hook(s.params[i].param, [weak, i](const Tensor&) {
      if (auto st = weak.lock()) st->on_ready(i);
    });
}

GradSync::~GradSync() {
  if (s_) s_->wait_all_noexcept();
}

void GradSync::set_sync(bool on) {
  s_->sync = on;
}
bool GradSync::sync() const {
  return s_->sync;
}
int GradSync::dp_size() const {
  return s_->group->size();
}
GradSyncMode GradSync::mode() const {
  return s_->opts.mode;
}
int64_t GradSync::bucket_bytes() const {
  return s_->opts.bucket_bytes;
}
int GradSync::launched_buckets() const {
  return s_->next_launch;
}

std::vector<std::vector<int>> GradSync::bucket_layout() const {
  std::vector<std::vector<int>> out;
  for (auto& b : s_->buckets) out.push_back(b.params);
  return out;
}

void GradSync::finish() {
  State& s = *s_;
  if (s.group->size() == 1) return;
  NoGradGuard ng;
  try {
    // Remaining buckets, in order: gradients whose hook did not fire in this pass are copied now.
    for (int bi = s.next_launch; bi < static_cast<int>(s.buckets.size()); ++bi) {
      for (int i : s.buckets[bi].params)
        if (!s.arrived[i]) s.copy_in(i);
    }
    s.launch_ready();
    NXD_INTERNAL_CHECK(s.next_launch == static_cast<int>(s.buckets.size()),
                       "GradSync::finish left buckets unlaunched");
    for (auto& b : s.buckets) {
      b.work.wait();
      charge_compute("dp_bucket_copy_out", 0, 2.0 * b.grad_numel * dtype_size(b.dtype), b.dtype);
      if (b.meta) continue;
      const Tensor fl = s.flags(b);
      for (size_t k = 0; k < b.params.size(); ++k) {
        const int i = b.params[k];
        const Tensor& p = s.params[i].param;
        Tensor avg = s.slot(i);
        Tensor g = p.grad();
        if (g.defined()) {
          g.copy_(avg);
        } else if (fl.at({static_cast<int64_t>(k)}) > 0) {
          p.set_grad(avg.to(p.dtype()).clone());
        }
      }
    }
  } catch (...) {
    s.wait_all_noexcept();
    s.reset();
    throw;
  }
  s.reset();
}

}  // namespace nxd::optim
