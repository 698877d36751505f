#include "nxd/collectives/communicator.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>

#include "nxd/runtime/context.h"

namespace nxd {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Work

void Work::wait() {
  if (impl_) impl_->wait();
  if (after_ && *after_) {
    auto f = std::move(*after_);
    *after_ = nullptr;
    f();
  }
}

bool Work::is_completed() {
  return !impl_ || impl_->test();
}

Work Work::then(std::function<void()> f) && {
  Work w(std::move(impl_));
  if (after_ && *after_) {
    auto first = std::move(*after_);
    w.after_ = std::make_shared<std::function<void()>>([first, f] {
      first();
      f();
    });
  } else {
    w.after_ = std::make_shared<std::function<void()>>(std::move(f));
  }
  return w;
}

// ---------------------------------------------------------------------------------------------
// Communicator: shared checks, default non-blocking forms, groups

std::string Communicator::group_str() const {
  std::string s = "[";
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ranks_[i]);
  }
  return s + "]";
}

void Communicator::check_count(const char* op, int64_t count) const {
  NXD_CHECK(count >= 0, "[", op, "] negative count ", count, " on group ", group_str(), " rank ",
            rank_);
}

void Communicator::check_reduction(const char* op, int64_t count, const ReduceSpec& r) const {
  check_count(op, count);
  NXD_CHECK(r.op != ReduceOp::avg || is_floating(r.dtype), "[", op,
            "] avg needs a floating dtype, got ", r.dtype, " on group ", group_str());
}

void Communicator::check_member(const char* op, const char* what, int r) const {
  NXD_CHECK(r >= 0 && r < size(), "[", op, "] ", what, " ", r, " is not a member of group ",
            group_str(), " (size ", size(), ")");
}

Work Communicator::iall_reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op) {
  all_reduce(s, r, n, t, op);
  return Work();
}
Work Communicator::iall_gather(const void* s, void* r, int64_t n, DType t) {
  all_gather(s, r, n, t);
  return Work();
}
Work Communicator::ireduce_scatter(const void* s, void* r, int64_t n, DType t, ReduceOp op) {
  reduce_scatter(s, r, n, t, op);
  return Work();
}
Work Communicator::ibroadcast(void* b, int64_t n, DType t, int root) {
  broadcast(b, n, t, root);
  return Work();
}
Work Communicator::isend(const void* b, int64_t n, DType t, int dst, int tag) {
  send(b, n, t, dst, tag);
  return Work();
}
namespace {
struct DeferredWork : Work::Impl {
  std::function<void()> run;
  bool done = false;
  void wait() override {
    if (!done) {
      done = true;
      run();
    }
  }
  bool test() override { return done; }
};
}  // namespace
Work Communicator::irecv(void* b, int64_t n, DType t, int src, int tag) {
  // Deferred to wait(): a receive posted before the matching send must not block the caller.
  check_member("irecv", "source", src);
  auto w = std::make_shared<DeferredWork>();
  w->run = [this, b, n, t, src, tag] { recv(b, n, t, src, tag); };
  return Work(w);
}

std::shared_ptr<Communicator> Communicator::new_group(const std::vector<int>& members) {
  std::vector<int> seen(size(), 0);
  int index = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    check_member("new_group", "rank", members[i]);
    NXD_CHECK(!seen[members[i]]++, "[new_group] rank ", members[i], " listed twice");
    if (members[i] == rank()) index = static_cast<int>(i);
  }
  NXD_CHECK(!members.empty(), "[new_group] empty member list");
  return split(index >= 0 ? 0 : -1, index);
}

// ---------------------------------------------------------------------------------------------
// Tensor forms

namespace {
void* data_or_null(const Tensor& t) {
  return t.is_meta() ? nullptr : t.raw_data();
}
Device dev(const Tensor& t) {
  return t.is_meta() ? Device::meta : Device::host;
}
// Moves axis 0 of `t` ([p, s0..]) next to axis `d` and merges them: [s0.., p*s_d, ..].
Tensor merge_leading(const Tensor& t, int64_t d) {
  if (d == 0) {
    Shape s(t.shape().begin() + 1, t.shape().end());
    s[0] *= t.size(0);
    return t.reshape(s);
  }
  std::vector<int64_t> perm;
  for (int64_t i = 1; i <= d; ++i) perm.push_back(i);
  perm.push_back(0);
  for (int64_t i = d + 1; i < t.dim(); ++i) perm.push_back(i);
  Shape s(t.shape().begin() + 1, t.shape().end());
  s[d] *= t.size(0);
  return t.permute(perm).contiguous().reshape(s);
}
// Splits axis `d` of `t` into [p, s_d/p] and moves p to the front (contiguous).
Tensor split_leading(const Tensor& t, int64_t d, int p) {
  Shape s = t.shape();
  Shape r(s.begin(), s.begin() + d);
  r.push_back(p);
  r.push_back(s[d] / p);
  r.insert(r.end(), s.begin() + d + 1, s.end());
  Tensor v = t.contiguous().reshape(r);
  std::vector<int64_t> perm{d};
  for (int64_t i = 0; i < v.dim(); ++i)
    if (i != d) perm.push_back(i);
  return v.permute(perm).contiguous();
}
}  // namespace

void Communicator::all_reduce(const Tensor& t, ReduceOp op) {
  if (t.is_meta()) return all_reduce(nullptr, nullptr, t.numel(), t.dtype(), op);
  if (t.is_contiguous()) return all_reduce(t.raw_data(), t.raw_data(), t.numel(), t.dtype(), op);
  Tensor c = t.contiguous();
  all_reduce(c.raw_data(), c.raw_data(), c.numel(), c.dtype(), op);
  t.copy_(c);
}

void Communicator::all_reduce(const Tensor& in, const Tensor& out, ReduceOp op) {
  NXD_CHECK_SHAPE(in.shape() == out.shape() && in.dtype() == out.dtype(), "[all_reduce] in ",
                  in.desc(), " and out ", out.desc(), " differ");
  Tensor i = in.contiguous();
  if (out.is_contiguous() && !out.is_meta())
    return all_reduce(data_or_null(i), out.raw_data(), i.numel(), i.dtype(), op);
  Tensor o = empty(out.shape(), out.dtype(), dev(out));
  all_reduce(data_or_null(i), data_or_null(o), i.numel(), i.dtype(), op);
  if (!out.is_meta()) out.copy_(o);
}

Tensor Communicator::all_gather(const Tensor& t, int64_t dim) {
  int64_t d = wrap_dim(dim, t.dim(), "all_gather");
  Tensor i = t.contiguous();
  Shape s{size()};
  s.insert(s.end(), t.shape().begin(), t.shape().end());
  Tensor buf = empty(s, t.dtype(), dev(t));
  all_gather(data_or_null(i), data_or_null(buf), i.numel(), i.dtype());
  return merge_leading(buf, d);
}

Tensor Communicator::reduce_scatter(const Tensor& t, int64_t dim, ReduceOp op) {
  int64_t d = wrap_dim(dim, t.dim(), "reduce_scatter");
  NXD_CHECK_SHAPE(t.size(d) % size() == 0, "[reduce_scatter] dim ", d, " of ", t.desc(), " (",
                  t.size(d), ") is not divisible by the group size ", size(), " of group ",
                  group_str());
  Tensor in = split_leading(t, d, size());
  Shape s = t.shape();
  s[d] /= size();
  Tensor out = empty(s, t.dtype(), dev(t));
  reduce_scatter(data_or_null(in), data_or_null(out), out.numel(), t.dtype(), op);
  return out;
}

void Communicator::broadcast(const Tensor& t, int root) {
  if (t.is_meta()) return broadcast(nullptr, t.numel(), t.dtype(), root);
  if (t.is_contiguous()) return broadcast(t.raw_data(), t.numel(), t.dtype(), root);
  Tensor c = t.contiguous();
  broadcast(c.raw_data(), c.numel(), c.dtype(), root);
  t.copy_(c);
}

void Communicator::reduce(const Tensor& t, int root, ReduceOp op) {
  if (t.is_meta()) return reduce(nullptr, nullptr, t.numel(), t.dtype(), op, root);
  Tensor c = t.contiguous();
  reduce(c.raw_data(), c.raw_data(), c.numel(), c.dtype(), op, root);
  if (!c.is_same(t) && rank() == root) t.copy_(c);
}

Tensor Communicator::all_to_all(const Tensor& t, int64_t split_dim, int64_t concat_dim) {
  int64_t sd = wrap_dim(split_dim, t.dim(), "all_to_all");
  int64_t cd = wrap_dim(concat_dim, t.dim(), "all_to_all");
  NXD_CHECK_SHAPE(t.size(sd) % size() == 0, "[all_to_all] split dim ", sd, " of ", t.desc(), " (",
                  t.size(sd), ") is not divisible by the group size ", size(), " of group ",
                  group_str());
  Tensor in = split_leading(t, sd, size());
  Tensor out = empty(in.shape(), t.dtype(), dev(t));
  all_to_all(data_or_null(in), data_or_null(out), in.numel() / size(), t.dtype());
  return merge_leading(out, cd);
}

void Communicator::send(const Tensor& t, int dst, int tag) {
  Tensor c = t.contiguous();
  send(data_or_null(c), c.numel(), c.dtype(), dst, tag);
}

void Communicator::recv(const Tensor& t, int src, int tag) {
  if (t.is_meta()) return recv(nullptr, t.numel(), t.dtype(), src, tag);
  if (t.is_contiguous()) return recv(t.raw_data(), t.numel(), t.dtype(), src, tag);
  Tensor c = empty(t.shape(), t.dtype());
  recv(c.raw_data(), c.numel(), c.dtype(), src, tag);
  t.copy_(c);
}

Work Communicator::iall_reduce(const Tensor& t, ReduceOp op) {
  if (t.is_meta() || t.is_contiguous()) {
    void* p = data_or_null(t);
    return iall_reduce(p, p, t.numel(), t.dtype(), op);
  }
  Tensor c = t.contiguous();
  return iall_reduce(c.raw_data(), c.raw_data(), c.numel(), c.dtype(), op).then([t, c] {
    t.copy_(c);
  });
}

Work Communicator::iall_gather(const Tensor& in, const Tensor& out) {
  NXD_CHECK_SHAPE(
      out.numel() == in.numel() * size() && in.dtype() == out.dtype() && out.is_contiguous(),
      "[iall_gather] out ", out.desc(), " must be contiguous with ", size(),
      " x the elements of in ", in.desc());
  Tensor i = in.contiguous();
  return iall_gather(data_or_null(i), data_or_null(out), i.numel(), i.dtype()).then([i] {});
}

Work Communicator::ireduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  NXD_CHECK_SHAPE(
      in.numel() == out.numel() * size() && in.dtype() == out.dtype() && out.is_contiguous(),
      "[ireduce_scatter] in ", in.desc(), " must hold ", size(),
      " x the elements of contiguous out ", out.desc());
  Tensor i = in.contiguous();
  return ireduce_scatter(data_or_null(i), data_or_null(out), out.numel(), i.dtype(), op).then([i] {
  });
}

Work Communicator::isend(const Tensor& t, int dst, int tag) {
  Tensor c = t.contiguous();
  return isend(data_or_null(c), c.numel(), c.dtype(), dst, tag).then([c] {});
}

Work Communicator::irecv(const Tensor& t, int src, int tag) {
  if (t.is_meta() || t.is_contiguous())
    return irecv(data_or_null(t), t.numel(), t.dtype(), src, tag).then([t] {});
  Tensor c = empty(t.shape(), t.dtype());
  return irecv(c.raw_data(), c.numel(), c.dtype(), src, tag).then([t, c] { t.copy_(c); });
}

namespace {
struct WorldSlot {
  std::shared_ptr<Communicator> comm;
};
}  // namespace

std::shared_ptr<Communicator> world_ptr() {
  Context& ctx = current_context();
  auto& slot = ctx.ext<WorldSlot>();
  if (!slot.comm) {
    NXD_CHECK_T(CommError, ctx.world_size() == 1, "[world] rank ", ctx.rank(), " of a world of ",
                ctx.world_size(),
                " has no communicator: run inside sim::launch or under MPI (mpi::init)");
    slot.comm = make_self_communicator(ctx.rank());
  }
  return slot.comm;
}

Communicator& world() {
  return *world_ptr();
}

void set_world(Context& ctx, std::shared_ptr<Communicator> comm) {
  ctx.ext<WorldSlot>().comm = std::move(comm);
}

}  // namespace nxd
