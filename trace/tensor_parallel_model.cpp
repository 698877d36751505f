#include <set>

#include "nxd/collectives/communicator.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/runtime/context.h"
#include "nxd/trace/model.h"

namespace nxd::trace {

TensorParallelModel::TensorParallelModel(TraceOptions opts, std::vector<Bucket> buckets,
                                         std::vector<RankProgram> ranks,
                                         std::vector<Tensor> example_inputs)
    : opts_(std::move(opts)),
      buckets_(std::move(buckets)),
      ranks_(std::move(ranks)),
      examples_(std::move(example_inputs)),
      stats_(buckets_.size()) {}

size_t TensorParallelModel::route(int64_t batch, int64_t seq) const {
  size_t best = buckets_.size();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& k = buckets_[b];
    if (k.batch < batch || k.seq < seq || (!opts_.pad_batch && k.batch != batch)) continue;
    if (best == buckets_.size()) {
      best = b;
      continue;
    }
    const Bucket& o = buckets_[best];
    if (k.batch * k.seq < o.batch * o.seq || (k.batch * k.seq == o.batch * o.seq && k.seq < o.seq))
      best = b;
  }
  if (best == buckets_.size()) {
    std::string all;
    for (const Bucket& k : buckets_)
      all += str(all.empty() ? "" : ", ", "[", k.batch, ",", k.seq, "]");
    throw ShapeError(str("[TensorParallelModel] input [batch=", batch, ", seq=", seq,
                         "] is larger than every bucket (", all, ")"));
  }
  return best;
}

std::vector<Tensor> TensorParallelModel::run_rank(size_t r, size_t bucket,
                                                  const std::vector<Tensor>& args) {
  RankProgram& p = ranks_[r];
  std::vector<Tensor> state;
  for (const auto& kv : p.state) state.push_back(kv.second);
  Bindings b{&p.params[bucket], &args, &state, &p.constants[bucket]};
  return run(*p.graphs[bucket], b, p.replay[bucket]);
}

namespace {

std::vector<Tensor> pad_inputs(const std::vector<Tensor>& in, const Bucket& k) {
  const int64_t B = in[0].size(0), S = in[0].size(1);
  std::vector<Tensor> out;
  for (const Tensor& x : in) {
    Shape s = x.shape();
    const bool b0 = !s.empty() && s[0] == B, s1 = b0 && s.size() >= 2 && s[1] == S;
    if (b0) s[0] = k.batch;
    if (s1) s[1] = k.seq;
    if (s == x.shape()) {
      out.push_back(x);
      continue;
    }
    Tensor p = zeros(s, x.dtype(), x.device());
    Tensor dst = p.narrow(0, 0, B);
    if (s1) dst = dst.narrow(1, 0, S);
    if (!x.is_meta()) dst.copy_(x);
    out.push_back(p);
  }
  return out;
}

std::vector<Tensor> cut_outputs(std::vector<Tensor> outs, const Bucket& k, int64_t B, int64_t S) {
  for (Tensor& y : outs) {
    if (y.dim() >= 1 && y.size(0) == k.batch && B != k.batch) y = y.narrow(0, 0, B);
    // [B, S, ...] outputs follow the sequence; [B, X] ones (e.g. last-token logits) do not
    if (y.dim() >= 3 && y.size(1) == k.seq && S != k.seq) y = y.narrow(1, 0, S);
    y = y.contiguous();
  }
  return outs;
}

}  // namespace

std::vector<Tensor> TensorParallelModel::forward(const std::vector<Tensor>& inputs) {
  NXD_CHECK(!inputs.empty() && inputs[0].dim() >= 2 && inputs.size() == examples_.size(),
            "[TensorParallelModel] expected ", examples_.size(),
            " inputs, the first [batch, seq], got ", inputs.size(),
            inputs.empty() ? std::string() : str(" (first ", inputs[0].desc(), ")"));
  const int64_t B = inputs[0].size(0), S = inputs[0].size(1);
  const size_t b = route(B, S);
  const Bucket& k = buckets_[b];
  stats_[b].calls += 1;
  stats_[b].real_tokens += B * S;
  stats_[b].padded_tokens += k.batch * k.seq - B * S;
  const std::vector<Tensor> args = pad_inputs(inputs, k);
  std::vector<Tensor> outs;
  if (opts_.backend == "mpi") {
    outs = run_rank(0, b, args);
    for (const Tensor& y : outs) world().broadcast(y, 0);  // rank 0's outputs everywhere
  } else if (ranks_.size() == 1) {
    outs = run_rank(0, b, args);
  } else {
    const int tp = opts_.tp_degree;
    sim::LaunchOptions lo;
    lo.world_size = tp;
    sim::launch(lo, [&] {
      parallel_state::initialize_model_parallel(tp);
      const int r = current_context().rank();
      std::vector<Tensor> o = run_rank(static_cast<size_t>(r), b, args);
      if (r == 0) outs = std::move(o);
    });
  }
  return cut_outputs(std::move(outs), k, B, S);
}

int64_t TensorParallelModel::resident_bytes() const {
  std::set<const Storage*> seen;
  int64_t total = 0;
  auto count = [&](const Tensor& t) {
    if (t.defined() && seen.insert(t.storage().get()).second) total += t.storage()->nbytes();
  };
  for (const RankProgram& p : ranks_) {
    for (const auto& kv : p.weights) count(kv.second);
    for (const auto& kv : p.state) count(kv.second);
    for (const auto& v : p.params)
      for (const Tensor& t : v) count(t);
    for (const auto& v : p.constants)
      for (const Tensor& t : v) count(t);
    for (const auto& g : p.graphs) total += g->plan.arena_bytes;  // allocated on first use
  }
  return total;
}

}  // namespace nxd::trace
