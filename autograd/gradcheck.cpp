// gradcheck: the analytic gradient of L = sum_k <r_k, f(x)_k> (r_k fixed random directions) is
// compared with central differences (L(x + eps e_j) - L(x - eps e_j)) / 2 eps for every element
// j of every floating input, all in double precision.
#include <cmath>

#include "nxd/autograd/function.h"
#include "nxd/runtime/init.h"

namespace nxd::autograd {

GradcheckResult gradcheck(const ForwardFn& fn, const std::vector<Tensor>& inputs,
                          GradcheckOptions opts) {
  std::vector<Tensor> xs(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    NoGradGuard ng;
    if (is_floating(inputs[i].dtype())) {
      xs[i] = inputs[i].detach().to(DType::f64).clone();
      xs[i].set_requires_grad(true);
    } else {
      xs[i] = inputs[i].detach();
    }
  }
  std::vector<Tensor> outs = fn(xs);
  std::vector<Tensor> dirs(outs.size());
  std::vector<Tensor> roots, seeds;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!is_floating(outs[k].dtype())) continue;
    NXD_CHECK(outs[k].dtype() == DType::f64, "[gradcheck] output ", k, " is ", outs[k].desc(),
              ": ops must keep f64 inputs in f64");
    dirs[k] = empty(outs[k].shape(), DType::f64);
    init::uniform(dirs[k], RngStream{12345, 1000 + k}, -1.0, 1.0);
    if (outs[k].requires_grad()) roots.push_back(outs[k]), seeds.push_back(dirs[k]);
  }
  std::vector<Tensor> wrt;
  std::vector<size_t> wrt_idx;
  for (size_t i = 0; i < xs.size(); ++i)
    if (xs[i].defined() && xs[i].requires_grad()) wrt.push_back(xs[i]), wrt_idx.push_back(i);
  GradcheckResult res;
  if (wrt.empty()) return res;
  std::vector<Tensor> analytic;
  if (roots.empty()) {
    for (auto& x : wrt) analytic.push_back(zeros_like(x.detach()));
  } else {
    analytic = grad(roots, wrt, seeds);
  }

  auto objective = [&]() {
    NoGradGuard ng;
    std::vector<Tensor> o = fn(xs);
    double s = 0;
    for (size_t k = 0; k < o.size(); ++k) {
      if (!dirs[k].defined()) continue;
      auto a = o[k].to_vector(), r = dirs[k].to_vector();
      for (size_t j = 0; j < a.size(); ++j) s += a[j] * r[j];
    }
    return s;
  };

  for (size_t w = 0; w < wrt.size(); ++w) {
    Tensor x = wrt[w];
    double* p = x.detach().data<double>();
    std::vector<double> an = analytic[w].to_vector();
    for (int64_t j = 0; j < x.numel(); ++j) {
      double orig = p[j];
      p[j] = orig + opts.eps;
      double up = objective();
      p[j] = orig - opts.eps;
      double down = objective();
      p[j] = orig;
      double num = (up - down) / (2 * opts.eps);
      if (std::fabs(num - an[j]) > opts.atol + opts.rtol * std::fabs(num)) {
        res.ok = false;
        res.message = str("[gradcheck] input ", wrt_idx[w], " (", inputs[wrt_idx[w]].desc(),
                          ") element ", j, ": numeric ", num, " vs analytic ", an[j], " (|diff| ",
                          std::fabs(num - an[j]), ")");
        return res;
      }
    }
  }
  return res;
}

}  // namespace nxd::autograd
