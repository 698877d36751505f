#include "nxd/runtime/kernels/attention.h"

#include <cmath>

#include "nxd/runtime/allocator.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/kernels/attention_common.h"
#include "nxd/runtime/kernels/nn_common.h"
#include "nxd/runtime/kernels/parallel_rows.h"
#include "nxd/runtime/kernels/softmax.h"

namespace nxd::kernels {

namespace {
thread_local int attention_priced_as = -1;  // a DType, or -1 outside an AttentionPricing scope
}  // namespace

AttentionPricing::AttentionPricing(DType priced_as) : prev_(attention_priced_as) {
  attention_priced_as = static_cast<int>(priced_as);
}
AttentionPricing::~AttentionPricing() {
  attention_priced_as = prev_;
}
DType AttentionPricing::dtype(DType operand) {
  return attention_priced_as < 0 ? operand : static_cast<DType>(attention_priced_as);
}

using namespace detail;

namespace {

// Query rows per GEMM block (causal attention skips the keys a block cannot see).
constexpr int64_t kRowBlock = 128;

}  // namespace

void attention_forward(const Tensor& out, const Tensor& probs, const Tensor& q, const Tensor& k,
                       const Tensor& v, bool causal, double scale) {
  const char* op = "attention_forward";
  Dims d = check_attention(op, q, k, v, causal, scale);
  check_out4(op, "out", out, q.shape(), q.dtype());
  if (probs.defined()) {
    Shape ps{d.b, d.hq, d.sq, d.sk};
    NXD_CHECK_SHAPE(probs.shape() == ps && probs.dtype() == q.dtype(), "[", op, "] probs is ",
                    probs.desc(), ", expected ", dtype_name(q.dtype()), shape_str(ps));
    NXD_CHECK(probs.is_meta() || probs.is_contiguous(), "[", op, "] probs must be contiguous");
  }
  double bh = double(d.b * d.hq);
  const DType priced = AttentionPricing::dtype(q.dtype());
  charge_compute(op, bh * (4.0 * d.sq * d.sk * d.d + 5.0 * d.sq * d.sk),
                 double(dtype_size(priced)) *
                     (2.0 * q.numel() + 2.0 * k.numel() + (probs.defined() ? bh * d.sq * d.sk : 0)),
                 blas::matmul_compute_dtype(priced));
  if (meta_only(op, out, {q, k, v}) || out.numel() == 0) return;
  if (!probs.defined()) check_scratch(d.sq * d.sk * q.element_size(), "attention scores");
  Tensor qc = gemm_input(q), kc = gemm_input(k), vc = gemm_input(v);
  dispatch_float(op, q, [&]<class T>() {
    Mat<T> Q = mat<T>(qc), K = mat<T>(kc), V = mat<T>(vc), O = mat<T>(out);
    for_units<T>(d.b * d.hq, 4.0 * d.sq * d.sk * d.d, [&](int64_t u0, int64_t u1) {
      std::vector<T> scratch(probs.defined() ? 0 : d.sq * d.sk);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t b = u / d.hq, h = u % d.hq, g = h / d.group;
        T* P = probs.defined() ? probs.data<T>() + u * d.sq * d.sk : scratch.data();
        // Causal: query rows in blocks of kRowBlock; a block only multiplies the keys it can see
        // (about half the flops of the full square), the rest of its P rows is zeroed.
        for (int64_t i0 = 0; i0 < d.sq; i0 += kRowBlock) {
          const int64_t rows = std::min(kRowBlock, d.sq - i0);
          const int64_t kc = causal ? std::min(d.sk, i0 + rows + d.sk - d.sq) : d.sk;
          T* Pb = P + i0 * d.sk;
          gemm<T>(Trans::no, Trans::yes, rows, kc, d.d, T(d.scale), Q.at(b, h) + i0 * Q.ld, Q.ld,
                  K.at(b, g), K.ld, T(0), Pb, d.sk);
          softmax_rows<T>(Pb, Pb, rows, d.sk, T(1), causal, rows, d.sk - d.sq + i0);
          gemm<T>(Trans::no, Trans::no, rows, d.d, kc, T(1), Pb, d.sk, V.at(b, g), V.ld, T(0),
                  O.at(b, h) + i0 * O.ld, O.ld);
        }
      }
    });
  });
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& probs, bool causal, double scale) {
  const char* op = "attention_backward";
  Dims d = check_attention(op, q, k, v, causal, scale);
  check_backward(op, {dq, dk, dv, dout, q, k, v, out, probs, "probs", {d.b, d.hq, d.sq, d.sk}});
  double bh = double(d.b * d.hq);
  const DType priced = AttentionPricing::dtype(q.dtype());
  charge_compute(
      op, bh * (8.0 * d.sq * d.sk * d.d + 4.0 * d.sq * d.sk),
      double(dtype_size(priced)) * (5.0 * q.numel() + 4.0 * k.numel() + 2.0 * bh * d.sq * d.sk),
      blas::matmul_compute_dtype(priced));
  if (meta_only(op, dq, {dout, q, k, v, out, probs})) return;
  dk.zero_();
  dv.zero_();
  if (dq.numel() == 0) return;
  Tensor qc = gemm_input(q), kc = gemm_input(k), vc = gemm_input(v), oc = gemm_input(out),
         gc = gemm_input(dout), pc = in(probs);
  dispatch_float(op, q, [&]<class T>() {
    Mat<T> Q = mat<T>(qc), K = mat<T>(kc), V = mat<T>(vc), O = mat<T>(oc), G = mat<T>(gc);
    Mat<T> DQ = mat<T>(dq), DK = mat<T>(dk), DV = mat<T>(dv);
    const T* probs_p = pc.data<T>();
    // one unit per (batch, kv head): the query heads of a group add into its dK and dV in head
    // order, as on one thread
    for_units<T>(d.b * d.hkv, 8.0 * d.group * d.sq * d.sk * d.d, [&](int64_t u0, int64_t u1) {
      std::vector<T> dp(std::min(kRowBlock, d.sq) * d.sk);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t b = u / d.hkv, g = u % d.hkv;
        for (int64_t h = g * d.group; h < (g + 1) * d.group; ++h) {
          const T* P = probs_p + (b * d.hq + h) * d.sq * d.sk;
          for (int64_t i0 = 0; i0 < d.sq; i0 += kRowBlock) {
            const int64_t rows = std::min(kRowBlock, d.sq - i0);
            const int64_t kc = causal ? std::min(d.sk, i0 + rows + d.sk - d.sq) : d.sk;
            const T* Pb = P + i0 * d.sk;
            const T* Gb = G.at(b, h) + i0 * G.ld;
            // dV[g] += P^T dO
            gemm<T>(Trans::yes, Trans::no, kc, d.d, rows, T(1), Pb, d.sk, Gb, G.ld, T(1),
                    DV.at(b, g), DV.ld);
            // dP = dO V^T
            gemm<T>(Trans::no, Trans::yes, rows, kc, d.d, T(1), Gb, G.ld, V.at(b, g), V.ld, T(0),
                    dp.data(), d.sk);
            // dS = P * (dP - rowsum(dO * O)), zero where masked
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t i = i0 + r;
              CArrMap<T> go(Gb + r * G.ld, d.d), o(O.at(b, h) + i * O.ld, d.d);
              T di = (go * o).sum();
              int64_t valid = causal ? std::min(i + 1 + d.sk - d.sq, d.sk) : d.sk;
              ArrMap<T> ds(dp.data() + r * d.sk, valid);
              ds = CArrMap<T>(Pb + r * d.sk, valid) * (ds - di);
              for (int64_t j = valid; j < kc; ++j) dp[r * d.sk + j] = T(0);
            }
            // dQ = scale dS K ; dK[g] += scale dS^T Q
            gemm<T>(Trans::no, Trans::no, rows, d.d, kc, T(d.scale), dp.data(), d.sk, K.at(b, g),
                    K.ld, T(0), DQ.at(b, h) + i0 * DQ.ld, DQ.ld);
            gemm<T>(Trans::yes, Trans::no, kc, d.d, rows, T(d.scale), dp.data(), d.sk,
                    Q.at(b, h) + i0 * Q.ld, Q.ld, T(1), DK.at(b, g), DK.ld);
          }
        }
      }
    });
  });
}

// ---------------- naive references (double, scalar loops) ----------------
namespace ref {

void attention_forward(const Tensor& out, const Tensor& probs, const Tensor& q, const Tensor& k,
                       const Tensor& v, bool causal, double scale) {
  Dims d = check_attention("ref::attention_forward", q, k, v, causal, scale);
  Tensor o64 = zeros(q.shape(), DType::f64), p64 = zeros({d.b, d.hq, d.sq, d.sk}, DType::f64);
  Tensor qq = q.to(DType::f64).contiguous(), kk = k.to(DType::f64).contiguous(),
         vv = v.to(DType::f64).contiguous();
  const double *Q = qq.data<double>(), *K = kk.data<double>(), *V = vv.data<double>();
  double *O = o64.data<double>(), *P = p64.data<double>();
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.hq; ++h) {
      int64_t g = h / d.group;
      const double* q0 = Q + (b * d.hq + h) * d.sq * d.d;
      const double* k0 = K + (b * d.hkv + g) * d.sk * d.d;
      const double* v0 = V + (b * d.hkv + g) * d.sk * d.d;
      double* p0 = P + (b * d.hq + h) * d.sq * d.sk;
      double* o0 = O + (b * d.hq + h) * d.sq * d.d;
      for (int64_t i = 0; i < d.sq; ++i) {
        double mx = -INFINITY, s = 0;
        std::vector<double> sc(d.sk, -INFINITY);
        for (int64_t j = 0; j < d.sk; ++j) {
          if (causal && j > i + d.sk - d.sq) continue;
          double dot = 0;
          for (int64_t e = 0; e < d.d; ++e) dot += q0[i * d.d + e] * k0[j * d.d + e];
          sc[j] = d.scale * dot;
          mx = std::max(mx, sc[j]);
        }
        for (int64_t j = 0; j < d.sk; ++j) s += std::exp(sc[j] - mx);
        for (int64_t j = 0; j < d.sk; ++j) {
          p0[i * d.sk + j] = std::exp(sc[j] - mx) / s;
          for (int64_t e = 0; e < d.d; ++e) o0[i * d.d + e] += p0[i * d.sk + j] * v0[j * d.d + e];
        }
      }
    }
  out.copy_(o64);
  if (probs.defined()) probs.copy_(p64);
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& probs, bool causal, double scale) {
  // Recomputes everything in double from q, k, v (out and probs are not trusted).
  Dims d = check_attention("ref::attention_backward", q, k, v, causal, scale);
  Tensor o64 = empty(q.shape(), DType::f64), p64 = empty({d.b, d.hq, d.sq, d.sk}, DType::f64);
  attention_forward(o64, p64, q, k, v, causal, scale);
  Tensor qq = q.to(DType::f64).contiguous(), kk = k.to(DType::f64).contiguous(),
         vv = v.to(DType::f64).contiguous(), gg = dout.to(DType::f64).contiguous();
  Tensor dq64 = zeros(q.shape(), DType::f64), dk64 = zeros(k.shape(), DType::f64),
         dv64 = zeros(v.shape(), DType::f64);
  const double *Q = qq.data<double>(), *K = kk.data<double>(), *V = vv.data<double>(),
               *G = gg.data<double>(), *P = p64.data<double>(), *O = o64.data<double>();
  double *DQ = dq64.data<double>(), *DK = dk64.data<double>(), *DV = dv64.data<double>();
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.hq; ++h) {
      int64_t g = h / d.group;
      int64_t qo = (b * d.hq + h) * d.sq * d.d, ko = (b * d.hkv + g) * d.sk * d.d;
      const double* p0 = P + (b * d.hq + h) * d.sq * d.sk;
      for (int64_t i = 0; i < d.sq; ++i) {
        double di = 0;
        for (int64_t e = 0; e < d.d; ++e) di += G[qo + i * d.d + e] * O[qo + i * d.d + e];
        for (int64_t j = 0; j < d.sk; ++j) {
          double dpij = 0;
          for (int64_t e = 0; e < d.d; ++e) dpij += G[qo + i * d.d + e] * V[ko + j * d.d + e];
          double dsij = p0[i * d.sk + j] * (dpij - di);
          for (int64_t e = 0; e < d.d; ++e) {
            DV[ko + j * d.d + e] += p0[i * d.sk + j] * G[qo + i * d.d + e];
            DQ[qo + i * d.d + e] += d.scale * dsij * K[ko + j * d.d + e];
            DK[ko + j * d.d + e] += d.scale * dsij * Q[qo + i * d.d + e];
          }
        }
      }
    }
  dq.copy_(dq64);
  dk.copy_(dk64);
  dv.copy_(dv64);
}

}  // namespace ref
}  // namespace nxd::kernels
