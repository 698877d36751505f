// Zero1Optimizer's expert parameters (optim/zero1.h): a second Zero1Optimizer over the
// expert-data-parallel group, as NxD runs two ZeRO-1 optimizers under expert parallelism.
#include <map>

#include "nxd/collectives/parallel_state.h"
#include "nxd/optim/zero1.h"
#include "nxd/runtime/error.h"

namespace nxd::optim {

std::vector<ParamGroup> Zero1Optimizer::split_experts(std::vector<ParamGroup> groups,
                                                      Zero1Options& o) {
  std::map<const TensorImpl*, int> is_expert;
  for (const NamedParam& p : o.expert_params) is_expert[p.param.impl()] = 0;
  // the same groups (indices, lr, weight decay) on both sides, each with its own parameters
  std::vector<ParamGroup> experts = groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    experts[g].params.clear();
    std::erase_if(groups[g].params, [&](const NamedParam& p) {
      auto it = is_expert.find(p.param.impl());
      if (it == is_expert.end()) return false;
      ++it->second;
      experts[g].params.push_back(p);
      return true;
    });
  }
  for (const NamedParam& p : o.expert_params)
    NXD_CHECK(is_expert.at(p.param.impl()) == 1, "[Zero1Optimizer] expert parameter '", p.name,
              "' is in no parameter group");
  Zero1Options eo = o;
  eo.expert_params.clear();
  eo.units = o.expert_units;  // stage three: each MoE layer's experts, a unit over expert-DP
  eo.unit_chain = o.expert_unit_chain;
  eo.expert_units.clear();
  eo.expert_unit_chain.clear();
  eo.lookup_units.clear();  // the dense optimizer's
  eo.roots.clear();
  eo.dp_group =
      o.expert_dp_group ? o.expert_dp_group : parallel_state::get_expert_data_parallel_group_ptr();
  std::erase_if(eo.registration_order,
                [&](const NamedParam& p) { return !is_expert.count(p.param.impl()); });
  experts_ = std::make_unique<Zero1Optimizer>(std::move(experts), std::move(eo));
  o.norm_groups.ep = nullptr;  // the dense parameters' norm: every DP rank holds them all
  return groups;
}

void Zero1Optimizer::sync_groups() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    experts_->groups_[g].lr = groups_[g].lr;
    experts_->groups_[g].weight_decay = groups_[g].weight_decay;
  }
}

}  // namespace nxd::optim
