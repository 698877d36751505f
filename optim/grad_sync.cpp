#include "nxd/optim/grad_sync.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "nxd/autograd/graph.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"

namespace nxd::optim {

const char* grad_sync_mode_name(GradSyncMode m) {
  return m == GradSyncMode::overlap ? "overlap" : "at_step";
}
const char* dp_reduction_name(DpReduction r) {
  return r == DpReduction::all_reduce ? "all_reduce" : "reduce_scatter";
}

namespace {

struct Bucket {
  DType dtype = DType::f32;  // of the gradients (the buffer)
  bool meta = false;         // shapes only: the collective is charged but moves no data
  std::vector<int> params;   // indices into State::params, in bucket order
  std::vector<int64_t> offsets;
  int64_t grad_numel = 0;   // gradients; all_reduce: then one flag per parameter
  int64_t shard_numel = 0;  // reduce_scatter: per rank (the buffer holds n of them)
  Tensor buf;
  Tensor shard;     // reduce_scatter: this rank's reduced part
  int pending = 0;  // gradients still to arrive in this pass
  bool launched = false;
  Work work;
  int64_t bytes() const { return grad_numel * dtype_size(dtype); }
};

}  // namespace

struct GradSync::State {
  std::vector<NamedParam> params;
  std::vector<int> bucket_of, pos_in_bucket;
  std::vector<char> arrived;   // this pass
  std::vector<char> has_grad;  // this rank had a gradient at launch; after finish(): any rank
  std::vector<Bucket> buckets;
  GradSyncOptions opts;
  std::shared_ptr<Communicator> group;
  bool sync = true;
  std::vector<std::weak_ptr<State>> linked;  // link_sync: their sync follows this one's
  bool active = false;                       // buffers exist
  int next_launch = 0;
  int64_t copied_bytes = 0;

  bool scatter() const { return opts.reduction == DpReduction::reduce_scatter; }
  bool shard_only() const { return opts.storage == GradStorage::shard_only; }
  int n() const { return group->size(); }

  std::vector<Tensor> slots;  // per parameter: its slice of its bucket (its gradient buffer)

  const Tensor& slot(int i) const { return slots[static_cast<size_t>(i)]; }
  Tensor flags(const Bucket& b) const {
    return b.buf.narrow(0, b.grad_numel, static_cast<int64_t>(b.params.size()));
  }

  // Makes the bucket's slices hold this pass's gradients: a parameter without .grad contributes
  // zeros, a .grad that is not its slice is copied in (and re-pointed to the slice).
  void prepare(Bucket& b) {
    if (shard_only()) return gather_into_buffer(b);
    for (size_t k = 0; k < b.params.size(); ++k) {
      const int i = b.params[k];
      const Tensor& p = params[i].param;
      Tensor g = p.grad();
      has_grad[i] = g.defined() ? 1 : 0;
      if (b.meta) continue;
      const Tensor& s = slot(i);
      if (!g.defined()) {
        s.zero_();
      } else if (!g.is_same(s)) {
        s.copy_(g);
        p.set_grad(s);
        copied_bytes += s.nbytes();
        charge_compute("dp_bucket_copy_in", 0, 2.0 * static_cast<double>(s.nbytes()), b.dtype);
      }
      if (!scatter()) flags(b).narrow(0, static_cast<int64_t>(k), 1).fill_(has_grad[i]);
    }
  }

  // shard_only: a fresh bucket buffer receives the parameters' .grad (zeros where a parameter has
  // none, and in the padding), and the .grads are freed.
  void gather_into_buffer(Bucket& b) {
    b.buf = zeros({b.shard_numel * n()}, b.dtype, b.meta ? Device::meta : Device::host);
    for (size_t k = 0; k < b.params.size(); ++k) {
      const int i = b.params[k];
      const Tensor& p = params[i].param;
      const Tensor g = p.grad();
      has_grad[i] = g.defined() ? 1 : 0;
      if (!g.defined()) continue;
      if (!b.meta) b.buf.narrow(0, b.offsets[k], p.numel()).view(p.shape()).copy_(g);
      // charged on meta too: nxd-plan's step is the run's (a meta copy moves nothing)
      charge_compute("dp_bucket_copy_in", 0, 2.0 * static_cast<double>(g.nbytes()), b.dtype);
      p.set_grad(Tensor());
    }
  }

  // shard_only: waits for bucket bi's reduction and frees its buffer.
  void retire(Bucket& b) {
    if (!shard_only() || !b.buf.defined()) return;
    b.work.wait();
    b.work = Work();
    b.buf = Tensor();
  }

  void launch(int bi) {
    Bucket& b = buckets[bi];
    prepare(b);
    if (n() > 1) {
      void* p = b.meta ? nullptr : b.buf.raw_data();
      if (scatter()) {
        // shard_only: out of place into the persistent shard
        void* s = b.meta ? nullptr : b.shard.raw_data();
        b.work = group->ireduce_scatter(p, s, b.shard_numel, b.dtype, ReduceOp::avg);
      } else {
        const int64_t count = b.grad_numel + static_cast<int64_t>(b.params.size());
        b.work = group->iall_reduce(p, p, count, b.dtype, ReduceOp::avg);
      }
    }
    b.launched = true;
    if (n() == 1 && shard_only() && !b.meta) b.shard.copy_(b.buf.narrow(0, 0, b.shard_numel));
  }

  // Launches, in bucket order, every complete bucket whose predecessors are launched.
  // shard_only: the bucket before a launched one is retired (at most two in flight).
  void launch_ready() {
    while (next_launch < static_cast<int>(buckets.size()) && buckets[next_launch].pending == 0) {
      launch(next_launch++);
      if (next_launch >= 2) retire(buckets[next_launch - 2]);
    }
  }

  void on_ready(int i) {
    if (!sync || opts.mode != GradSyncMode::overlap) return;
    NXD_CHECK(!arrived[i], "[GradSync] the gradient of parameter '", params[i].name,
              "' became ready twice before finish() with sync on: run all but the last "
              "microbatch's backward under no_sync() / set_sync(false)");
    arrived[i] = 1;
    if (at_release(i)) return;  // the unit's release launches its buckets
    --buckets[bucket_of[i]].pending;
    launch_ready();
  }

  bool at_release(int i) const {
    if (opts.unit_launch != UnitLaunch::at_release || opts.units.empty()) return false;
    const int u = opts.units[static_cast<size_t>(i)];
    return u != 0 && (opts.first_root_unit == 0 || u < opts.first_root_unit);
  }

  void unit_released(int unit) {
    if (!active || !sync || opts.mode != GradSyncMode::overlap || group->size() == 1 ||
        opts.units.empty())
      return;
    for (auto& b : buckets)
      if (!b.launched && opts.units[static_cast<size_t>(b.params[0])] == unit) b.pending = 0;
    launch_ready();
  }

  // After the buckets' reductions completed: the results of an all_reduce into .grad, the
  // flags of a reduce_scatter exchanged.
  void complete() {
    if (scatter()) {
      if (n() > 1) {
        std::vector<double> any(has_grad.begin(), has_grad.end());
        group->all_reduce(any.data(), any.data(), static_cast<int64_t>(any.size()), DType::f64,
                          ReduceOp::max);
        for (size_t i = 0; i < any.size(); ++i) has_grad[i] = any[i] > 0 ? 1 : 0;
      }
      return;
    }
    for (auto& b : buckets) {
      if (b.meta) continue;
      const Tensor fl = flags(b);
      for (size_t k = 0; k < b.params.size(); ++k) {
        const int i = b.params[k];
        has_grad[i] = fl.at({static_cast<int64_t>(k)}) > 0 ? 1 : 0;
        // the slice holds the average (zeros from this rank when it had no gradient)
        if (has_grad[i] && !params[i].param.grad().defined()) params[i].param.set_grad(slot(i));
      }
    }
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
    for (auto& b : buckets) {
      if (b.launched) try {
          b.work.wait();
        } catch (...) {
        }
      if (shard_only()) b.buf = Tensor();
    }
  }

  void build_buckets();
};

// Buckets: reverse registration order; an open bucket per parameter dtype (and device kind),
// closed once it holds bucket_bytes; bucket order = creation order.
void GradSync::State::build_buckets() {
  const int np = static_cast<int>(params.size());
  bucket_of.assign(np, -1);
  pos_in_bucket.assign(np, -1);
  std::map<std::pair<DType, bool>, int> open;  // (parameter dtype, meta) -> bucket index
  for (int i = np - 1; i >= 0; --i) {
    const Tensor& t = params[i].param;
    // a bucket holds one unit's parameters (ZeRO-3): a new unit closes every open bucket
    if (!opts.units.empty() && i < np - 1 &&
        opts.units[static_cast<size_t>(i)] != opts.units[static_cast<size_t>(i) + 1])
      open.clear();
    const DType gdt = t.dtype() == DType::bf16 && opts.fp32_grad_acc ? DType::f32 : t.dtype();
    const auto key = std::make_pair(t.dtype(), t.is_meta());
    auto it = open.find(key);
    if (it == open.end()) {
      buckets.push_back(Bucket{.dtype = gdt, .meta = t.is_meta()});
      it = open.emplace(key, static_cast<int>(buckets.size()) - 1).first;
    }
    Bucket& b = buckets[it->second];
    bucket_of[i] = it->second;
    pos_in_bucket[i] = static_cast<int>(b.params.size());
    b.params.push_back(i);
    b.offsets.push_back(b.grad_numel);
    b.grad_numel += t.numel();
    if (b.bytes() >= opts.bucket_bytes) open.erase(it);
  }
  const Device dev_meta = Device::meta;
  for (auto& b : buckets) {
    const Device dev = b.meta ? dev_meta : Device::host;
    if (shard_only()) {
      b.shard_numel = (b.grad_numel + n() - 1) / n();
      b.shard = zeros({b.shard_numel}, b.dtype, dev);
    } else if (scatter()) {
      b.shard_numel = (b.grad_numel + n() - 1) / n();
      b.buf = zeros({b.shard_numel * n()}, b.dtype, dev);
      // in place: this rank's block of the bucket receives its reduced shard
      b.shard = b.buf.narrow(0, group->rank() * b.shard_numel, b.shard_numel);
    } else {
      b.shard_numel = b.grad_numel;
      b.buf = zeros({b.grad_numel + static_cast<int64_t>(b.params.size())}, b.dtype, dev);
    }
    b.pending = static_cast<int>(b.params.size());
  }
  for (int i = 0; i < np; ++i) {
    const Bucket& b = buckets[static_cast<size_t>(bucket_of[i])];
    const Tensor& p = params[i].param;
    if (shard_only()) {  // no buffers: fresh .grads in the bucket's dtype
      autograd::set_grad_dtype(p, b.dtype);
      continue;
    }
    slots.push_back(b.buf.narrow(0, b.offsets[pos_in_bucket[i]], p.numel()).view(p.shape()));
    autograd::set_grad_buffer(p, slots.back());
  }
}

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
  NXD_CHECK(opts.units.empty() || opts.units.size() == params.size(), "[GradSync] units lists ",
            opts.units.size(), " parameters, the GradSync ", params.size());
  NXD_CHECK(opts.storage == GradStorage::buckets || opts.reduction == DpReduction::reduce_scatter,
            "[GradSync] storage shard_only needs reduction reduce_scatter, got ",
            dp_reduction_name(opts.reduction));
  // the data x context group (the DP group at CP 1): a context-parallel model's loss gives each
  // CP rank CP times its share of the gradient, so the mean over DP x CP is the gradient
  s.group = opts.group ? opts.group : parallel_state::get_data_context_parallel_group_ptr();
  NXD_CHECK(s.group != nullptr, "[GradSync] no data-parallel group");
  s.opts = std::move(opts);
  s.params = std::move(params);
  const int np = static_cast<int>(s.params.size());
  std::unordered_map<const TensorImpl*, int> seen;
  bool f32_acc_needed = false;
  for (int i = 0; i < np; ++i) {
    const NamedParam& p = s.params[i];
    NXD_CHECK(p.param.defined(), "[GradSync] parameter '", p.name, "' is undefined");
    NXD_CHECK(p.param.requires_grad() && autograd::is_leaf(p.param), "[GradSync] parameter '",
              p.name, "' (", p.param.desc(), ") is not a leaf that requires grad");
    NXD_CHECK(is_floating(p.param.dtype()), "[GradSync] parameter '", p.name, "' is ",
              p.param.desc(), ": gradients must be floating point");
    auto [it, fresh] = seen.emplace(p.param.impl(), i);
    NXD_CHECK(fresh, "[GradSync] the same tensor is listed twice: '", s.params[it->second].name,
              "' and '", p.name, "' (tied weights must be listed once)");
    f32_acc_needed = f32_acc_needed || (p.param.dtype() == DType::bf16 && s.opts.fp32_grad_acc);
  }
  s.arrived.assign(np, 0);
  s.has_grad.assign(np, 0);
  s.active = s.group->size() > 1 || s.scatter() || f32_acc_needed;
  if (!s.active) return;  // nothing to reduce, nothing to accumulate differently
  s.build_buckets();
  if (s.group->size() == 1) return;  // no collectives: no hooks
  std::weak_ptr<State> weak = s_;
  for (int i = 0; i < np; ++i)
    autograd::register_hook(s.params[i].param, [weak, i](const Tensor&) {
      if (auto st = weak.lock()) st->on_ready(i);
    });
}

GradSync::~GradSync() {
  if (!s_) return;
  s_->wait_all_noexcept();
  if (s_->active)
    for (const auto& p : s_->params) {
      autograd::set_grad_buffer(p.param, Tensor());
      autograd::reset_grad_dtype(p.param);
    }
}

void GradSync::set_sync(bool on) {
  s_->sync = on;
  for (const auto& w : s_->linked)
    if (auto f = w.lock()) f->sync = on;
}
void GradSync::link_sync(GradSync& follower) {
  s_->linked.push_back(follower.s_);
  follower.s_->sync = s_->sync;
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
DpReduction GradSync::reduction() const {
  return s_->opts.reduction;
}
int64_t GradSync::bucket_bytes() const {
  return s_->opts.bucket_bytes;
}
int GradSync::launched_buckets() const {
  return s_->next_launch;
}
int64_t GradSync::copied_bytes() const {
  return s_->copied_bytes;
}
bool GradSync::has_buckets() const {
  return s_->active;
}
int64_t GradSync::buffer_bytes() const {
  int64_t n = 0;
  for (const auto& b : s_->buckets)
    if (!b.meta) n += s_->shard_only() ? b.shard.nbytes() : b.buf.nbytes();  // shard: in buf
  return n;
}

std::vector<std::vector<int>> GradSync::bucket_layout() const {
  std::vector<std::vector<int>> out;
  for (auto& b : s_->buckets) out.push_back(b.params);
  return out;
}

const std::vector<NamedParam>& GradSync::params() const {
  return s_->params;
}
int GradSync::num_buckets() const {
  return static_cast<int>(s_->buckets.size());
}
int GradSync::bucket_of(int param) const {
  return s_->bucket_of.at(static_cast<size_t>(param));
}
int64_t GradSync::offset_in_bucket(int param) const {
  const State& s = *s_;
  const int b = s.bucket_of.at(static_cast<size_t>(param));
  return s.buckets[static_cast<size_t>(b)].offsets[static_cast<size_t>(s.pos_in_bucket[param])];
}
int64_t GradSync::shard_numel(int b) const {
  return s_->buckets.at(static_cast<size_t>(b)).shard_numel;
}
DType GradSync::bucket_dtype(int b) const {
  return s_->buckets.at(static_cast<size_t>(b)).dtype;
}
Tensor GradSync::bucket_shard(int b) const {
  NXD_CHECK(s_->scatter(), "[GradSync] bucket_shard() needs reduction reduce_scatter");
  return s_->buckets.at(static_cast<size_t>(b)).shard;
}
bool GradSync::has_grad(int param) const {
  return s_->has_grad.at(static_cast<size_t>(param)) != 0;
}

void GradSync::unit_released(int unit) {
  NoGradGuard ng;
  s_->unit_released(unit);
}

std::function<void()> GradSync::unit_release_callback(int unit) const {
  std::weak_ptr<State> weak = s_;
  return [weak, unit] {
    if (auto st = weak.lock()) {
      NoGradGuard ng;
      st->unit_released(unit);
    }
  };
}

void GradSync::finish() {
  State& s = *s_;
  if (!s.active) return;
  NoGradGuard ng;
  try {
    for (int bi = s.next_launch; bi < static_cast<int>(s.buckets.size()); ++bi)
      s.buckets[bi].pending = 0;
    s.launch_ready();
    NXD_INTERNAL_CHECK(s.next_launch == static_cast<int>(s.buckets.size()),
                       "GradSync::finish left buckets unlaunched");
    for (auto& b : s.buckets) {
      b.work.wait();
      s.retire(b);
    }
    s.complete();
  } catch (...) {
    s.wait_all_noexcept();
    s.reset();
    throw;
  }
  s.reset();
}

}  // namespace nxd::optim
