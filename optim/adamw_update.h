#pragma once
// The AdamW update kernel shared by AdamW (optimizer.cpp) and the ZeRO-1 optimizer
// (zero1_step.cpp), so both compute bitwise the same update from the same gradient. Internal to
// nxd_optim.
#include <cmath>
#include <cstdint>

namespace nxd::optim::detail {

// The hyperparameters of one parameter's update at its step t (1 for the first update).
struct AdamWStep {
  double lr, weight_decay, beta1, beta2, eps;
  int64_t t;
};

// One AdamW update of a parameter, applied to element ranges (elementwise: any split of the
// elements gives the same result).
template <class T>
struct AdamWUpdate {
  T* p;
  const T* g;
  T* m;
  T* v;
  T decay, neg_step, bc2_sqrt, b1_t, b2_t, omb1, omb2, eps_t;
  bool do_decay;

  AdamWUpdate(T* p_, const T* g_, T* m_, T* v_, const AdamWStep& s) : p(p_), g(g_), m(m_), v(v_) {
    const double lr = s.lr, wd = s.weight_decay, b1 = s.beta1, b2 = s.beta2, eps = s.eps;
    const int64_t t = s.t;
    const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
    decay = static_cast<T>(1.0 - lr * wd);
    neg_step = static_cast<T>(-(lr / bc1));
    bc2_sqrt = static_cast<T>(std::sqrt(bc2));
    b1_t = static_cast<T>(b1), b2_t = static_cast<T>(b2);
    omb1 = static_cast<T>(1.0 - b1), omb2 = static_cast<T>(1.0 - b2);
    eps_t = static_cast<T>(eps);
    do_decay = wd != 0;
  }

  void operator()(int64_t begin, int64_t end) const {
    T* __restrict p = this->p;  // local restrict pointers: the loop vectorizes
    const T* __restrict g = this->g;
    T* __restrict m = this->m;
    T* __restrict v = this->v;
    const T decay = this->decay, neg_step = this->neg_step, bc2_sqrt = this->bc2_sqrt;
    const T b1_t = this->b1_t, b2_t = this->b2_t, omb1 = this->omb1, omb2 = this->omb2;
    const T eps_t = this->eps_t;
    const bool do_decay = this->do_decay;
    for (int64_t i = begin; i < end; ++i) {
      T pi = do_decay ? p[i] * decay : p[i];
      T gi = g[i];
      T mi = b1_t * m[i] + omb1 * gi;
      T vi = b2_t * v[i] + omb2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      T denom = std::sqrt(vi) / bc2_sqrt + eps_t;
      p[i] = pi + neg_step * mi / denom;  // torch's addcdiv order: (alpha * m) / denom
    }
  }
};

}  // namespace nxd::optim::detail
