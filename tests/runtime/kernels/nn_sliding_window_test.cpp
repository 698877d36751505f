// The fused attention kernels with a sliding window (Mistral's: query i at key position
// p = i + Sk - Sq sees keys (p - window, p]) against a naive double reference of the values, the
// log-sum-exp and the gradients: windows inside one block, across block edges, wider than the
// sequence (= no window, bitwise), Sk > Sq, GQA; both backward schedules bitwise alike; the
// cached (KV-cache) attention with the same window.
#include <gtest/gtest.h>

#include <cmath>

#include "nxd/runtime/kernels/flash_attention.h"
#include "nxd/runtime/kernels/kv_cache.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
namespace k = nxd::kernels;

namespace {

Tensor randn(const Shape& s, DType dt, uint64_t seed) {
  return nxd::testing::randn_from(s, dt, {seed, 31}, 1.0);
}

struct Ref {
  Tensor o, lse, dq, dk, dv;
};

// softmax(scale q k^T + window mask) v, its log-sum-exp and the gradients of sum(o * g), in
// double, one (b, h) at a time.
Ref reference(const Tensor& q, const Tensor& kk, const Tensor& v, const Tensor& g, int64_t w) {
  const int64_t B = q.size(0), H = q.size(1), sq = q.size(2), D = q.size(3), sk = kk.size(2);
  const int64_t grp = H / kk.size(1);
  const double sc = 1.0 / std::sqrt(double(D));
  Ref r{zeros(q.shape(), DType::f64), zeros({B, H, sq}, DType::f64), zeros(q.shape(), DType::f64),
        zeros(kk.shape(), DType::f64), zeros(v.shape(), DType::f64)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t p = i + sk - sq, lo = w > 0 ? std::max<int64_t>(0, p - w + 1) : 0;
        std::vector<double> s(sk, 0.0);
        double mx = -INFINITY, z = 0;
        for (int64_t j = lo; j <= p; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += q.at({b, h, i, e}) * kk.at({b, h / grp, j, e});
          s[j] = sc * dot;
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = lo; j <= p; ++j) z += s[j] = std::exp(s[j] - mx);
        r.lse.set({b, h, i}, mx + std::log(z));
        for (int64_t j = lo; j <= p; ++j) s[j] /= z;  // P
        double delta = 0;
        for (int64_t e = 0; e < D; ++e) {
          double o = 0;
          for (int64_t j = lo; j <= p; ++j) o += s[j] * v.at({b, h / grp, j, e});
          r.o.set({b, h, i, e}, o);
          delta += o * g.at({b, h, i, e});
        }
        for (int64_t j = lo; j <= p; ++j) {
          double dp = 0;
          for (int64_t e = 0; e < D; ++e) {
            dp += g.at({b, h, i, e}) * v.at({b, h / grp, j, e});
            r.dv.set({b, h / grp, j, e}, r.dv.at({b, h / grp, j, e}) + s[j] * g.at({b, h, i, e}));
          }
          const double ds = s[j] * (dp - delta) * sc;
          for (int64_t e = 0; e < D; ++e) {
            r.dq.set({b, h, i, e}, r.dq.at({b, h, i, e}) + ds * kk.at({b, h / grp, j, e}));
            r.dk.set({b, h / grp, j, e}, r.dk.at({b, h / grp, j, e}) + ds * q.at({b, h, i, e}));
          }
        }
      }
  return r;
}

struct WindowCase {
  int64_t hq, hkv, sq, sk, window;
};

}  // namespace

TEST(SlidingWindowAttention, MatchesNaiveReferenceAndSchedulesAgree) {
  for (WindowCase c : {WindowCase{2, 2, 130, 130, 1}, WindowCase{2, 1, 130, 130, 20},
                       WindowCase{2, 2, 130, 130, 64}, WindowCase{4, 2, 150, 150, 65},
                       WindowCase{2, 1, 7, 130, 30}, WindowCase{2, 1, 70, 200, 100}}) {
    for (DType dt : {DType::f32, DType::f64}) {
      SCOPED_TRACE(str(dtype_name(dt), " hq=", c.hq, " hkv=", c.hkv, " sq=", c.sq, " sk=", c.sk,
                       " window=", c.window));
      const double tol = dt == DType::f64 ? 1e-12 : 2e-5;
      Tensor q = randn({2, c.hq, c.sq, 8}, dt, 1), kk = randn({2, c.hkv, c.sk, 8}, dt, 2),
             v = randn({2, c.hkv, c.sk, 8}, dt, 3), g = randn({2, c.hq, c.sq, 8}, dt, 4);
      Tensor o = empty_like(q), lse = empty({2, c.hq, c.sq}, dt);
      k::flash_attention_forward(o, lse, q, kk, v, true, 0.0, c.window);
      const Ref r = reference(q, kk, v, g, c.window);
      EXPECT_ALLCLOSE(o, r.o.to(dt), 0, tol);
      EXPECT_ALLCLOSE(lse, r.lse.to(dt), 0, tol);
      std::vector<Tensor> grads[2];
      int n = 0;
      for (auto s : {k::FlashBackwardSchedule::one_pass, k::FlashBackwardSchedule::two_pass}) {
        k::set_flash_backward_schedule(s);
        Tensor dq = empty_like(q), dk = empty_like(kk), dv = empty_like(v);
        k::flash_attention_backward(dq, dk, dv, g, q, kk, v, o, lse, true, 0.0, c.window);
        grads[n++] = {dq, dk, dv};
      }
      k::set_flash_backward_schedule(k::FlashBackwardSchedule::one_pass);
      EXPECT_ALLCLOSE(grads[0][0], r.dq.to(dt), 0, tol);
      EXPECT_ALLCLOSE(grads[0][1], r.dk.to(dt), 0, tol);
      EXPECT_ALLCLOSE(grads[0][2], r.dv.to(dt), 0, tol);
      for (int t = 0; t < 3; ++t) EXPECT_BITWISE_EQ(grads[0][t], grads[1][t]) << "gradient " << t;
    }
  }
}

TEST(SlidingWindowAttention, WindowPastTheKeysIsNoWindowBitwise) {
  Tensor q = randn({1, 2, 100, 8}, DType::f32, 5), kk = randn({1, 2, 100, 8}, DType::f32, 6),
         v = randn({1, 2, 100, 8}, DType::f32, 7), g = randn({1, 2, 100, 8}, DType::f32, 8);
  Tensor o0 = empty_like(q), l0 = empty({1, 2, 100}), o1 = empty_like(q), l1 = empty({1, 2, 100});
  k::flash_attention_forward(o0, l0, q, kk, v, true, 0.0, 0);
  k::flash_attention_forward(o1, l1, q, kk, v, true, 0.0, 100);
  EXPECT_BITWISE_EQ(o0, o1);
  EXPECT_BITWISE_EQ(l0, l1);
  Tensor a[3] = {empty_like(q), empty_like(kk), empty_like(v)};
  Tensor b[3] = {empty_like(q), empty_like(kk), empty_like(v)};
  k::flash_attention_backward(a[0], a[1], a[2], g, q, kk, v, o0, l0, true, 0.0, 0);
  k::flash_attention_backward(b[0], b[1], b[2], g, q, kk, v, o1, l1, true, 0.0, 100);
  for (int t = 0; t < 3; ++t) EXPECT_BITWISE_EQ(a[t], b[t]) << "gradient " << t;
  EXPECT_THROW(k::flash_attention_forward(o0, l0, q, kk, v, false, 0.0, 4), Error);
  EXPECT_THROW(k::flash_attention_forward(o0, l0, q, kk, v, true, 0.0, -1), Error);
}

TEST(SlidingWindowAttention, CachedAttentionMatchesReference) {
  // two rows at different positions of a 40-long cache, prefill-like S = 6 and a window of 5
  const int64_t Bmax = 3, Hkv = 2, L = 40, D = 8, B = 2, S = 6, Hq = 4;
  Tensor kc = randn({Bmax, Hkv, L, D}, DType::f32, 9),
         vc = randn({Bmax, Hkv, L, D}, DType::f32, 10);
  Tensor q = randn({B, Hq, S, D}, DType::f32, 11);
  Tensor seq = from_vector<int64_t>({2, 0}, {B}), start = from_vector<int64_t>({20, 3}, {B}),
         len = from_vector<int64_t>({6, 4}, {B});
  for (int64_t w : {0, 1, 5, 30}) {
    SCOPED_TRACE(str("window ", w));
    Tensor o = empty_like(q), r = empty_like(q);
    k::cached_attention_forward(o, q, kc, vc, seq, start, len, 0.0, w);
    k::ref::cached_attention_forward(r, q, kc, vc, seq, start, len, 0.0, w);
    EXPECT_ALLCLOSE(o, r, 0, 1e-5);
  }
}
