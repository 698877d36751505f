// The KV-cache kernels' naive references (runtime/kernels/kv_cache.h, namespace ref): cached
// attention and rotary embeddings at per-row offsets, in double, element by element, for the
// tests to compare the fast kernels with.
#include <algorithm>
#include <cmath>
#include <vector>

#include "nxd/runtime/kernels/kv_cache.h"

namespace nxd::kernels {

namespace ref {

void cached_attention_forward(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                              const Tensor& v_cache, const Tensor& seq_ids, const Tensor& start,
                              const Tensor& lengths, double scale, int64_t window) {
  const int64_t B = q.size(0), Hq = q.size(1), S = q.size(2), D = q.size(3);
  const int64_t g = Hq / k_cache.size(1);
  const double sc = scale > 0 ? scale : 1.0 / std::sqrt(double(D));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t sid = seq_ids.at({b}), st = start.at({b}), len = lengths.at({b});
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t s = 0; s < S; ++s) {
        if (s >= len) {
          for (int64_t d = 0; d < D; ++d) out.set({b, h, s, d}, 0.0);
          continue;
        }
        const int64_t n = st + s + 1, j0 = window > 0 ? std::max<int64_t>(0, n - window) : 0;
        std::vector<double> w(n, -INFINITY);
        double mx = -INFINITY, z = 0;
        for (int64_t j = j0; j < n; ++j) {
          double a = 0;
          for (int64_t d = 0; d < D; ++d) a += q.at({b, h, s, d}) * k_cache.at({sid, h / g, j, d});
          w[j] = a * sc;
          mx = std::max(mx, w[j]);
        }
        for (auto& x : w) z += x = std::exp(x - mx);  // exp(-inf) = 0 outside the window
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < n; ++j) o += w[j] / z * v_cache.at({sid, h / g, j, d});
          out.set({b, h, s, d}, o);
        }
      }
  }
}

void rotary_at_forward(const Tensor& y, const Tensor& x, const Tensor& start, int64_t rotary_dim,
                       double base, const RopeScaling& scaling) {
  const int64_t D = x.size(3), r = rotary_dim == 0 ? D : rotary_dim, half = r / 2;
  for (int64_t b = 0; b < x.size(0); ++b)
    for (int64_t h = 0; h < x.size(1); ++h)
      for (int64_t p = 0; p < x.size(2); ++p) {
        const double pos = double(start.at({b}) + p);
        for (int64_t i = 0; i < half; ++i) {
          const double th = pos * scaling.apply(std::pow(base, -2.0 * i / r));
          const double a = x.at({b, h, p, i}), c = x.at({b, h, p, i + half});
          y.set({b, h, p, i}, a * std::cos(th) - c * std::sin(th));
          y.set({b, h, p, i + half}, c * std::cos(th) + a * std::sin(th));
        }
        for (int64_t i = r; i < D; ++i) y.set({b, h, p, i}, x.at({b, h, p, i}));
      }
}

}  // namespace ref
}  // namespace nxd::kernels
