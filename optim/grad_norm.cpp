#include "nxd/optim/grad_norm.h"

#include <algorithm>
#include <cmath>

#include <unordered_set>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/moe/moe.h"
#include "nxd/runtime/error.h"

namespace nxd::optim {

namespace {

void reduce_over(const std::shared_ptr<Communicator>& g, double& v, bool inf) {
  if (!g || g->size() == 1) return;
  g->all_reduce(&v, &v, 1, DType::f64, inf ? ReduceOp::max : ReduceOp::sum);
}

}  // namespace

std::vector<NormParam> norm_params(Module& root) {
  std::unordered_set<const TensorImpl*> experts;
  for (const Tensor& t : moe_expert_parameters(root)) experts.insert(t.impl());
  std::vector<NormParam> out;
  for (auto& p : parallel_parameters(root))
    out.push_back({.name = p.name,
                   .param = p.tensor,
                   .attrs = p.attrs,
                   .expert = experts.count(p.tensor.impl()) != 0});
  return out;
}

NormGroups NormGroups::from_parallel_state() {
  NormGroups g;
  g.tp = parallel_state::get_tensor_model_parallel_group_ptr();
  g.pp = parallel_state::get_pipeline_model_parallel_group_ptr();
  if (parallel_state::get_expert_model_parallel_size() > 1)
    g.ep = parallel_state::get_expert_model_parallel_group_ptr();
  return g;
}

double parallel_grad_norm(const std::vector<NormParam>& params, const NormGroups& groups,
                          double norm_type) {
  NXD_CHECK(norm_type == kInfNorm || norm_type == 2.0,
            "[parallel_grad_norm] norm_type must be 2 or kInfNorm (-1), got ", norm_type);
  const bool inf = norm_type == kInfNorm;
  const int tp = groups.tp ? groups.tp->size() : 1;
  const int tp_rank = groups.tp ? groups.tp->rank() : 0;
  NoGradGuard ng;
  double total = 0.0, experts = 0.0;
  for (const auto& p : params) {
    if (p.shared) continue;
    Tensor g = p.param.grad();
    if (!g.defined() || g.is_meta()) continue;
    NXD_CHECK(!p.attrs.tensor_model_parallel || p.attrs.num_partitions == tp,
              "[parallel_grad_norm] parameter '", p.name, "' is sharded over ",
              p.attrs.num_partitions, " ranks but the TP group has ", tp, " rank(s)",
              groups.tp ? " " + groups.tp->group_str() : std::string(" (none given)"));
    const bool sharded = p.attrs.tensor_model_parallel && tp > 1;
    if (!sharded && tp_rank != 0) continue;  // TP-duplicated: counted on TP rank 0 only
    const int64_t m = sharded ? p.attrs.kv_replicas : 1;
    NXD_CHECK(m >= 1 && tp % m == 0, "[parallel_grad_norm] parameter '", p.name,
              "' has kv_replicas ", m, " which does not divide the TP size ", tp);
    const double s = grad_stat(g, grad_stat_of_norm(norm_type));
    double& acc = p.expert ? experts : total;
    acc = inf ? std::max(acc, s) : acc + s / static_cast<double>(m);
  }
  reduce_over(groups.ep, experts, inf);  // each EP rank holds other experts
  total = inf ? std::max(total, experts) : total + experts;
  reduce_over(groups.tp, total, inf);
  reduce_over(groups.pp, total, inf);
  reduce_over(groups.zero1, total, inf);
  return inf ? total : std::sqrt(total);
}

void clip_grads_with_norm(const std::vector<NormParam>& params, double max_norm,
                          double total_norm) {
  NXD_CHECK(max_norm > 0, "[clip_grads_with_norm] max_norm must be > 0, got ", max_norm);
  const double coef = max_norm / (total_norm + 1e-6);
  if (!(coef < 1.0)) return;  // also when the norm is NaN
  std::vector<Tensor> ts;
  ts.reserve(params.size());
  for (const auto& p : params) ts.push_back(p.param);
  scale_grads(ts, coef);
}

double clip_parallel_grad_norm(const std::vector<NormParam>& params, double max_norm,
                               const NormGroups& groups, double norm_type) {
  NXD_CHECK(max_norm > 0, "[clip_parallel_grad_norm] max_norm must be > 0, got ", max_norm);
  const double total = parallel_grad_norm(params, groups, norm_type);
  clip_grads_with_norm(params, max_norm, total);
  return total;
}

double clip_parallel_grad_norm(Module& model, double max_norm, double norm_type) {
  return clip_parallel_grad_norm(norm_params(model), max_norm, NormGroups::from_parallel_state(),
                                 norm_type);
}

}  // namespace nxd::optim
