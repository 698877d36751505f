#include "nxd/layers/moe/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "nxd/autograd/ops.h"
#include "nxd/autograd/ops/moe.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/moe/dispatch.h"
#include "nxd/layers/parallel/mappings.h"
#include "nxd/layers/param_unit.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"

namespace nxd {

void MoeConfig::validate() const {
  if (!enabled()) {
    if (num_experts < 0)
      throw ConfigError(str("[MoeConfig] num_experts=", num_experts, " must be >= 0"));
    return;
  }
  if (top_k < 1 || top_k > num_experts)
    throw ConfigError(
        str("[MoeConfig] top_k=", top_k, " must be in [1, num_experts=", num_experts, "]"));
  if (frequency < 1) throw ConfigError(str("[MoeConfig] frequency=", frequency, " must be >= 1"));
  if (!dropless && !(capacity_factor > 0))
    throw ConfigError(
        str("[MoeConfig] capacity_factor=", capacity_factor, " must be > 0 (or set dropless)"));
  if (router_aux_loss_coef < 0 || router_z_loss_coef < 0)
    throw ConfigError(str("[MoeConfig] router_aux_loss_coef=", router_aux_loss_coef,
                          " and router_z_loss_coef=", router_z_loss_coef, " must be >= 0"));
}

void MoeConfig::validate_parallel(int ep) const {
  if (ep <= 1) return;
  if (!enabled())
    throw ConfigError(str("[MoeConfig] expert_model_parallel_size=", ep,
                          " needs a mixture-of-experts model (moe.num_experts > 0)"));
  if (num_experts % ep != 0)
    throw ConfigError(str("[MoeConfig] num_experts=", num_experts,
                          " is not divisible by expert_model_parallel_size=", ep));
}

MixtralExpert::MixtralExpert(const Options& o) : Module("MixtralExpert") {
  ColumnParallelLinearOptions in;
  in.bias = false;
  in.gather_output = false;
  in.weight_init = o.in_init;
  in.param = o.param;
  in.group = o.tp_group;
  RowParallelLinearOptions out;
  out.bias = false;
  out.input_is_parallel = true;
  out.weight_init = o.out_init;
  out.param = o.param;
  out.group = o.tp_group;
  const int64_t H = o.hidden_size, I = o.ffn_hidden_size;
  w1_ = register_module("w1", std::make_shared<ColumnParallelLinear>(H, I, in));
  w2_ = register_module("w2", std::make_shared<RowParallelLinear>(I, H, out));
  w3_ = register_module("w3", std::make_shared<ColumnParallelLinear>(H, I, in));
}

Tensor MixtralExpert::forward(const Tensor& x, double s) const {
  return linear(
      swiglu(linear(x, scale_grad(w1_->weight(), s)), linear(x, scale_grad(w3_->weight(), s))),
      scale_grad(w2_->weight(), s));
}

MoeMlp::MoeMlp(const MoeMlpOptions& o)
    : Module("MoeMlp"),
      cfg_(o.moe),
      hidden_(o.hidden_size),
      ep_(o.ep_group),
      tp_(o.tp_group ? o.tp_group : make_self_communicator(current_context().rank())),
      seq_dim_(o.sequence_dimension) {
  cfg_.validate();
  NXD_CHECK(cfg_.enabled() && hidden_ > 0 && o.ffn_hidden_size > 0,
            "[MoeMlp] need num_experts > 0 and positive sizes, got num_experts=", cfg_.num_experts,
            " hidden=", hidden_, " ffn=", o.ffn_hidden_size);
  const int ep = ep_size();
  cfg_.validate_parallel(ep);
  sp_ = o.sequence_parallel && tp_->size() > 1;
  if (o.cp_group && o.cp_group->size() > 1) {
    cp_ = o.cp_group;
    NXD_CHECK_T(ConfigError, cfg_.dropless, "[MoeMlp] context parallelism (size ", cp_->size(),
                ") needs dropless experts: capacity_factor=", cfg_.capacity_factor,
                " drops by the whole sequence's token order, which no rank holds");
  }
  local_ = cfg_.num_experts / ep;
  first_ = (ep_ ? ep_->rank() : 0) * local_;
  LinearOptions lo;
  lo.bias = false;
  lo.weight_init = o.init.weight();
  lo.param = o.param;
  gate_ = register_module("gate", std::make_shared<Linear>(hidden_, cfg_.num_experts, lo));
  experts_ = register_module("experts", std::make_shared<ModuleList>(first_));
  const MixtralExpert::Options eo{.hidden_size = hidden_,
                                  .ffn_hidden_size = o.ffn_hidden_size,
                                  .in_init = o.init.weight(),
                                  .out_init = o.init.weight(WeightRole::residual_output),
                                  .param = o.param,
                                  .tp_group = tp_};
  for (int64_t e = 0; e < local_; ++e) experts_->push_back(std::make_shared<MixtralExpert>(eo));
}

struct MoeMlp::Routing {
  std::vector<int64_t> tok, slot;   // kept assignments, by expert then token
  std::vector<int64_t> per_expert;  // kept per expert [E]
  std::vector<int64_t> load;        // routed per expert before drops [E]
  int64_t dropped = 0;
};

MoeMlp::Routing MoeMlp::route(const Tensor&, const Tensor& idx) const {
  const int64_t T = idx.size(0), k = idx.size(1), E = cfg_.num_experts;
  std::vector<int64_t> e_of(static_cast<size_t>(T * k));
  if (idx.is_meta()) {  // shapes only (the planner): a balanced routing, token t -> t, t+1, ...
    for (int64_t a = 0; a < T * k; ++a) e_of[static_cast<size_t>(a)] = (a / k + a % k) % E;
  } else {
    e_of = idx.contiguous().to_vector_as<int64_t>();
  }
  Routing r;
  r.load.assign(static_cast<size_t>(E), 0);
  r.per_expert.assign(static_cast<size_t>(E), 0);
  for (int64_t e : e_of) ++r.load[static_cast<size_t>(e)];
  const int64_t cap =
      cfg_.dropless
          ? T * k
          : static_cast<int64_t>(std::ceil(cfg_.capacity_factor * static_cast<double>(T * k) /
                                           static_cast<double>(E)));
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(E));
  for (int64_t a = 0; a < T * k; ++a) {  // token order: an expert keeps its first `cap`
    auto& v = by_expert[static_cast<size_t>(e_of[static_cast<size_t>(a)])];
    if (static_cast<int64_t>(v.size()) < cap)
      v.push_back(a);
    else
      ++r.dropped;
  }
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t a : by_expert[static_cast<size_t>(e)]) {
      r.tok.push_back(a / k);
      r.slot.push_back(a);
    }
    r.per_expert[static_cast<size_t>(e)] = static_cast<int64_t>(by_expert[e].size());
  }
  return r;
}

Tensor MoeMlp::run_experts(const Tensor& rows, const std::vector<int64_t>& counts) const {
  const double scale = 1.0 / static_cast<double>(ep_size());
  // ZeRO-3 with expert parallelism: the experts are a unit of their own, sharded over expert-DP,
  // gathered around their GEMMs (a plain call otherwise: layers/param_unit.h)
  return run_param_unit(*experts_, rows, [&](const Tensor& in) {
    std::vector<Tensor> outs;
    int64_t off = 0;
    for (int64_t e = 0; e < local_; ++e) {
      const int64_t n = counts.at(static_cast<size_t>(e));
      if (n == 0) continue;
      outs.push_back(experts_->at<MixtralExpert>(static_cast<size_t>(e))
                         ->forward(narrow(in, 0, off, n), scale));
      off += n;
    }
    // no rows here: keep the graph through (expert parallelism's backward exchanges need it)
    if (outs.empty()) return mul(in, 0.0);
    return outs.size() == 1 ? outs[0] : cat(outs, 0);
  });
}

Tensor MoeMlp::run_parallel(const Tensor& rows, const Routing& r) const {
  Communicator& g = *ep_;
  const int P = g.size();
  const int64_t El = local_;
  // every member's per-expert counts [P*E] (one all-gather): each pair's count, hence the
  // padding of all four exchanges (dispatch, combine, their backward), known here
  const int64_t E = cfg_.num_experts;
  const std::vector<int64_t> all = gather_counts(g, r.per_expert);
  std::vector<int64_t> got(static_cast<size_t>(P * El));  // [P*El]: to my experts, by source
  RowCounts c;
  c.send.assign(static_cast<size_t>(P), 0);
  c.recv.assign(static_cast<size_t>(P), 0);
  c.cap = 0;
  for (int p = 0; p < P; ++p)
    for (int q = 0; q < P; ++q) {
      int64_t n = 0;  // rows member p sends member q
      for (int64_t e = 0; e < El; ++e) n += all[static_cast<size_t>(p * E + q * El + e)];
      c.cap = std::max(c.cap, n);
      if (p == g.rank()) c.send[q] = n;
      if (q == g.rank()) c.recv[p] = n;
    }
  for (int p = 0; p < P; ++p)
    for (int64_t e = 0; e < El; ++e)
      got[static_cast<size_t>(p * El + e)] = all[static_cast<size_t>(p * E + g.rank() * El + e)];
  Tensor recv = all_to_all_rows(rows, c, g);  // by source, then local expert
  // expert-major order (sources in order within an expert) and its inverse
  std::vector<int64_t> base(static_cast<size_t>(P), 0), counts(static_cast<size_t>(El), 0);
  for (int p = 1; p < P; ++p) base[p] = base[p - 1] + c.recv[p - 1];
  std::vector<int64_t> perm, inv(static_cast<size_t>(recv.size(0)));
  for (int64_t e = 0; e < El; ++e)
    for (int p = 0; p < P; ++p) {
      int64_t off = base[p];
      for (int64_t f = 0; f < e; ++f) off += got[static_cast<size_t>(p * El + f)];
      const int64_t n = got[static_cast<size_t>(p * El + e)];
      for (int64_t i = 0; i < n; ++i) {
        inv[static_cast<size_t>(off + i)] = static_cast<int64_t>(perm.size());
        perm.push_back(off + i);
      }
      counts[static_cast<size_t>(e)] += n;
    }
  const int64_t R = recv.size(0);
  Tensor y = run_experts(embedding(from_vector(perm, {R}), recv), counts);
  Tensor back = embedding(from_vector(inv, {R}), y);
  return all_to_all_rows(back, RowCounts{c.recv, c.send, c.cap}, g);
}

namespace {
// Megatron's MoEAuxLossAutoScaler: the identity on the layer's output y, whose backward also
// seeds the auxiliary loss's gradient with `scale` (the factor the training loss is scaled by
// before backward), so the router gets d(aux)/d(logits) x scale in the same backward pass as
// everything else: through a recomputed layer and on a pipeline stage without the loss.
Tensor inject_aux_grad(const Tensor& y, const Tensor& aux, double scale) {
  if (!aux.defined() || !aux.requires_grad()) return y;
  Tensor out = y.detach();
  const DType dt = aux.dtype();
  const bool meta = aux.is_meta();
  autograd::record(
      "moe_aux_loss_grad", {y, aux}, {out}, [scale, dt, meta](const Grads& g) -> Grads {
        return {g[0], meta ? empty({}, dt, Device::meta) : from_doubles({scale}, {}, dt)};
      });
  return out;
}
}  // namespace

Tensor MoeMlp::aux_losses(const Tensor& logits, const Tensor& probs, const Routing& r,
                          int64_t T) const {
  const int64_t E = cfg_.num_experts, k = cfg_.top_k;
  const bool meta = probs.is_meta();
  // context parallelism: the loads and the token count of the whole sequence (raw sums over CP;
  // on meta tensors (the planner) too, over its planned loads, so the collective is charged)
  std::vector<int64_t> load = r.load;
  int64_t Tg = T;
  if (cp_) {
    load.push_back(T);
    cp_->all_reduce(load.data(), load.data(), E + 1, DType::i64, ReduceOp::sum);
    Tg = load.back();
    load.pop_back();
  }
  const double inv = 1.0 / static_cast<double>(Tg);
  // load balancing: E/k * sum_e (load_e / T) * mean_t p_te (under CP this rank's tokens' part)
  std::vector<double> f(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) f[e] = static_cast<double>(load[e]) * inv;
  Tensor ft = meta ? empty({E}, probs.dtype(), Device::meta) : from_doubles(f, {E}, probs.dtype());
  Tensor pm = cp_ ? mul(sum(probs, {0}), inv) : mean(probs, {0});
  Tensor lb = mul(sum(mul(pm, ft)), static_cast<double>(E) / static_cast<double>(k));
  Tensor aux = mul(lb, cfg_.router_aux_loss_coef);
  double figs[2] = {meta ? 0.0 : lb.item(), 0.0};  // load balancing, z-loss
  if (cfg_.router_z_loss_coef > 0) {
    Tensor lse = select(sub(logits, log_softmax(logits, -1)), 1, 0);  // logsumexp per token
    Tensor z = cp_ ? mul(sum(square(lse)), inv) : mean(square(lse));
    aux = add(aux, mul(z, cfg_.router_z_loss_coef));
    if (!meta) figs[1] = z.item();
  }
  if (cp_) cp_->all_reduce(figs, figs, 2, DType::f64, ReduceOp::sum);
  stats_ = MoeStats{};
  stats_.tokens = Tg;
  stats_.assignments = Tg * k;
  stats_.dropped = r.dropped;
  stats_.aux_loss = figs[0];
  stats_.z_loss = figs[1];
  stats_.expert_load = load;
  return aux;
}

Tensor MoeMlp::forward(const Tensor& x) const {
  NXD_CHECK_SHAPE(x.dim() >= 2 && x.size(-1) == hidden_, "[MoeMlp] expected [..., ", hidden_,
                  "], got ", x.desc());
  const int Q = tp_size();
  const int64_t k = cfg_.top_k;
  // sequence parallelism: the whole sequence on every TP rank (backward: reduce-scatter)
  Tensor xf = sp_ ? gather_from_sequence_parallel_region(x, seq_dim_, true, *tp_) : x;
  const int64_t T = xf.numel() / hidden_;
  Tensor X = reshape(xf, {T, hidden_});
  // The router's input gradient is the same on every TP rank; under SP the gather's
  // reduce-scatter sums the Q copies. The experts' is this rank's shard's part: summed over TP.
  Tensor Xr = sp_ ? scale_grad(X, 1.0 / Q) : X;
  Tensor Xe = Q > 1 && !sp_ ? copy_to_tensor_model_parallel_region(X, *tp_) : X;
  Tensor logits = gate_->forward(Xr);  // [T,E]
  Tensor probs = softmax(logits, -1);
  std::vector<Tensor> tk = topk(probs, k);
  Tensor w = tk[0];
  if (cfg_.normalize_top_k_affinities) w = div(w, sum(w, {-1}, /*keepdim=*/true));
  // each TP rank's affinity gradient comes from its experts' shards: summed over TP
  if (Q > 1) w = copy_to_tensor_model_parallel_region(w, *tp_);
  const Routing r = route(probs, tk[1]);
  aux_ = aux_losses(logits, probs, r, T);

  const int64_t M = static_cast<int64_t>(r.tok.size());
  Tensor tok = from_vector(r.tok, {M});
  Tensor rows = embedding(tok, Xe);                                         // [M,H]
  Tensor wr = embedding(from_vector(r.slot, {M}), reshape(w, {T * k, 1}));  // [M,1]
  Tensor ys = ep_size() > 1 ? run_parallel(rows, r) : run_experts(rows, r.per_expert);
  Tensor y = reshape(scatter_add_rows(mul(ys, wr), tok, T), xf.shape());
  // TP: the partial outputs summed once for the layer
  if (sp_)
    y = reduce_scatter_to_sequence_parallel_region(y, seq_dim_, *tp_);
  else if (Q > 1)
    y = reduce_from_tensor_model_parallel_region(y, *tp_);
  const double cp = cp_ ? static_cast<double>(cp_->size()) : 1.0;
  y = inject_aux_grad(y, aux_, TrainingLossScale::current() * cp);
  aux_ = aux_.detach();  // its gradient comes through y's backward
  if (cp_) {             // the whole sequence's value (the planner: charged, no value)
    const bool meta = aux_.is_meta();
    double v = meta ? 0.0 : aux_.item();
    cp_->all_reduce(&v, &v, 1, DType::f64, ReduceOp::sum);
    if (!meta) aux_ = from_doubles({v}, {}, aux_.dtype());
  }
  return y;
}

std::shared_ptr<Communicator> moe_expert_parallel_group() {
  namespace ps = parallel_state;
  if (!ps::model_parallel_is_initialized() || ps::get_expert_model_parallel_size() == 1)
    return nullptr;
  return ps::get_expert_model_parallel_group_ptr();
}

std::shared_ptr<Communicator> moe_tensor_parallel_group() {
  namespace ps = parallel_state;
  if (!ps::model_parallel_is_initialized() || ps::get_tensor_model_parallel_size() == 1)
    return nullptr;
  return ps::get_tensor_model_parallel_group_ptr();
}

std::vector<Tensor> moe_expert_parameters(Module& root) {
  std::vector<Tensor> out;
  for (auto& [name, m] : root.named_modules())
    if (auto* moe = dynamic_cast<MoeMlp*>(m))
      for (auto& [n, p] : moe->get_child("experts")->named_parameters()) out.push_back(p);
  return out;
}

std::vector<Module*> moe_expert_modules(Module& root) {
  std::vector<Module*> out;
  for (auto& [name, m] : root.named_modules())
    if (auto* moe = dynamic_cast<MoeMlp*>(m)) out.push_back(moe->get_child("experts").get());
  return out;
}

std::vector<const MoeMlp*> moe_layers(Module& root) {
  std::vector<const MoeMlp*> out;
  for (auto& [name, m] : root.named_modules())
    if (const auto* moe = dynamic_cast<const MoeMlp*>(m)) out.push_back(moe);
  return out;
}

void add_moe_step_metrics(Module& root, StepMetrics& out) {
  using C = StepMetrics::Combine;
  out.declare("moe_aux_loss", C::sum);
  out.declare("moe_tokens_dropped", C::sum);
  out.declare("moe_expert_load_min", C::min);
  out.declare("moe_expert_load_max", C::max);
  for (const MoeMlp* l : moe_layers(root)) {
    if (l->aux_loss().defined() && !l->aux_loss().is_meta())  // a meta step has no values
      out.add("moe_aux_loss", C::sum, l->aux_loss().item());
    out.add("moe_tokens_dropped", C::sum, static_cast<double>(l->stats().dropped));
    for (int64_t n : l->stats().expert_load) {
      out.add("moe_expert_load_min", C::min, static_cast<double>(n));
      out.add("moe_expert_load_max", C::max, static_cast<double>(n));
    }
  }
}

}  // namespace nxd
