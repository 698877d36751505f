// Gradient norms and clipping over local tensors (torch.nn.utils.clip_grad_norm_).
#include <algorithm>
#include <cmath>

#include "nxd/optim/items.h"
#include "nxd/optim/optimizer.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::optim {

GradStat grad_stat_of_norm(double norm_type) {
  return norm_type == kInfNorm ? GradStat::max_abs : GradStat::sum_of_squares;
}

double grad_stat(const Tensor& grad, GradStat stat) {
  const bool inf = stat == GradStat::max_abs;
  Tensor g = grad.contiguous();
  NXD_CHECK(is_floating(g.dtype()), "[grad_norm] gradient ", g.desc(), " is not floating point");
  // 1024-element blocks, each into its own double partial (8 interleaved lanes, so the loop
  // vectorizes, combined pairwise); the partials are added in block order
  constexpr int64_t kPart = 1024, kLanes = 8;
  const int64_t n = g.numel();
  std::vector<double> part(kernels::num_chunks(n, kPart));
  auto run = [&](auto load) {
    kernels::for_chunks(n, kPart, 2, [&](int64_t c, int64_t i0, int64_t i1) {
      double acc[kLanes] = {};
      int64_t i = i0;
      if (inf) {
        for (; i < i1; ++i) acc[0] = std::max(acc[0], std::abs(load(i)));
        part[c] = acc[0];
        return;
      }
      for (; i + kLanes <= i1; i += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) {
          const double x = load(i + l);
          acc[l] += x * x;
        }
      for (int64_t w = kLanes / 2; w > 0; w /= 2)
        for (int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
      for (; i < i1; ++i) {
        const double x = load(i);
        acc[0] += x * x;
      }
      part[c] = acc[0];
    });
  };
  dispatch(g.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                  std::is_same_v<T, bf16>) {
      const T* d = g.data<T>();
      if constexpr (std::is_same_v<T, bf16>)
        run([d](int64_t i) { return static_cast<double>(static_cast<float>(d[i])); });
      else
        run([d](int64_t i) { return static_cast<double>(d[i]); });
    }
  });
  double s = 0;
  for (double p : part) s = inf ? std::max(s, p) : s + p;
  return s;
}

double grad_norm(const std::vector<Tensor>& params, double norm_type) {
  NXD_CHECK(norm_type == kInfNorm || norm_type == 2.0,
            "[grad_norm] norm_type must be 2 or kInfNorm (-1), got ", norm_type);
  NoGradGuard ng;
  const bool inf = norm_type == kInfNorm;
  double acc = 0.0;
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    const double s = grad_stat(g, grad_stat_of_norm(norm_type));
    acc = inf ? std::max(acc, s) : acc + s;
  }
  return inf ? acc : std::sqrt(acc);
}

void scale_grads(const std::vector<Tensor>& params, double coef) {
  NoGradGuard ng;
  std::vector<Tensor> fast;
  std::vector<int64_t> sizes;
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.is_contiguous() && (g.dtype() == DType::f32 || g.dtype() == DType::f64)) {
      fast.push_back(g);
      sizes.push_back(g.numel());
    } else {
      std::vector<double> v = g.to_vector();
      for (auto& x : v) x *= coef;
      g.copy_(from_doubles(v, g.shape(), DType::f64));
    }
  }
  detail::for_each_item(sizes, 1, [&](size_t j, int64_t b, int64_t e) {
    dispatch(fast[j].dtype(), [&]<class T>() {
      if constexpr (std::is_floating_point_v<T>) {
        T* d = fast[j].data<T>();
        const T c = static_cast<T>(coef);
        for (int64_t i = b; i < e; ++i) d[i] *= c;
      }
    });
  });
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  NXD_CHECK(max_norm > 0, "[clip_grad_norm] max_norm must be > 0, got ", max_norm);
  const double total = grad_norm(params, norm_type);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) scale_grads(params, coef);
  return total;
}

}  // namespace nxd::optim
