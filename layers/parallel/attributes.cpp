#include "nxd/layers/parallel/attributes.h"

#include <unordered_map>

#include "nxd/collectives/parallel_state.h"

namespace nxd {

const ParallelAttrs* ParallelModule::parallel_attrs(const std::string& local_name) const {
  auto it = attrs_.find(local_name);
  return it == attrs_.end() ? nullptr : &it->second;
}

void ParallelModule::set_parallel_attrs(const std::string& local_name, const ParallelAttrs& a) {
  attrs_[local_name] = a;
}

std::vector<ParallelParameter> parallel_parameters(Module& root) {
  std::unordered_map<std::string, ParallelAttrs> tagged;
  for (auto& [prefix, m] : root.named_modules()) {
    auto* pm = dynamic_cast<ParallelModule*>(m);
    if (!pm) continue;
    for (auto& [local, t] : pm->named_parameters(/*recurse=*/false))
      if (const ParallelAttrs* a = pm->parallel_attrs(local))
        tagged[prefix.empty() ? local : prefix + "." + local] = *a;
  }
  std::vector<ParallelParameter> out;
  for (auto& [name, t] : root.named_parameters()) {
    auto it = tagged.find(name);
    out.push_back({name, t, it == tagged.end() ? ParallelAttrs{} : it->second});
  }
  return out;
}

void allreduce_sequence_parallel_gradients(Module& root) {
  allreduce_sequence_parallel_gradients(root, parallel_state::get_tensor_model_parallel_group());
}

void allreduce_sequence_parallel_gradients(Module& root, Communicator& group) {
  if (group.size() == 1) return;
  std::vector<Tensor> grads;
  int64_t total = 0;
  for (auto& p : parallel_parameters(root)) {
    if (!p.attrs.sequence_parallel_enabled) continue;
    Tensor g = p.tensor.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    total += g.numel();
  }
  if (grads.empty()) return;
  NoGradGuard ng;
  // One flat f32 buffer (f64 if any grad is f64): one collective, bf16 reduced in f32.
  DType dt = DType::f32;
  for (auto& g : grads)
    if (g.dtype() == DType::f64) dt = DType::f64;
  if (grads.front().is_meta()) {  // shapes only (nxd-plan's meta step): the sum's cost, no data
    group.all_reduce(nullptr, nullptr, total, dt, ReduceOp::sum);
    return;
  }
  Tensor flat = empty({total}, dt);
  int64_t off = 0;
  for (auto& g : grads) {
    flat.narrow(0, off, g.numel()).view(g.shape()).copy_(g);
    off += g.numel();
  }
  group.all_reduce(flat, ReduceOp::sum);
  off = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, off, g.numel()).view(g.shape()));
    off += g.numel();
  }
}

}  // namespace nxd
