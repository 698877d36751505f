#include "nxd/runtime/kernels/dropout.h"

#include "nxd/runtime/kernels/nn_common.h"

namespace nxd::kernels {

using namespace detail;

namespace {

// stream.uniform(i) for i in [i0, i0 + n), bit-identical to RngStream::uniform, written so the
// compiler vectorizes across i (the 10 Philox rounds are unrolled per lane).
void uniforms(float* out, const RngStream& st, uint64_t i0, int64_t n) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  const uint32_t key0 = static_cast<uint32_t>(st.seed), key1 = static_cast<uint32_t>(st.seed >> 32);
  const uint32_t c2i = static_cast<uint32_t>(st.stream),
                 c3i = static_cast<uint32_t>(st.stream >> 32);
  for (int64_t j = 0; j < n; ++j) {
    uint64_t ctr = i0 + static_cast<uint64_t>(j);
    uint32_t c0 = static_cast<uint32_t>(ctr), c1 = static_cast<uint32_t>(ctr >> 32), c2 = c2i,
             c3 = c3i, k0 = key0, k1 = key1;
#pragma GCC unroll 10
    for (int r = 0; r < 10; ++r) {
      uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
      uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
      uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0, n1 = static_cast<uint32_t>(p1);
      uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1, n3 = static_cast<uint32_t>(p0);
      c0 = n0, c1 = n1, c2 = n2, c3 = n3;
      k0 += kW0, k1 += kW1;
    }
    out[j] = static_cast<float>(c0 >> 8) * (1.0f / 16777216.0f);
  }
}

constexpr int64_t kBlock = 1024;

}  // namespace

void dropout_apply(const Tensor& y, const Tensor& x, double p, const RngStream& stream) {
  const char* op = "dropout_apply";
  NXD_CHECK(p >= 0.0 && p <= 1.0, "[", op, "] p must be in [0, 1], got ", p);
  check_out(op, y, x.shape(), x.dtype());
  charge_compute(op, 30.0 * x.numel(), 2.0 * x.nbytes(), x.dtype());
  if (meta_only(op, y, {x})) return;
  Tensor xc = in(x);
  dispatch_float(op, x, [&]<class T>() {
    const T* xp = xc.data<T>();
    T* yp = y.data<T>();
    int64_t n = x.numel();
    if (p >= 1.0) {
      std::fill(yp, yp + n, T(0));
      return;
    }
    const T scale = T(1.0 / (1.0 - p));
    const float pf = static_cast<float>(p);
    // compare in double so that p is not rounded: keep iff u >= p
    const bool exact = static_cast<double>(pf) == p;
    float u[kBlock];
    for (int64_t s = 0; s < n; s += kBlock) {
      int64_t m = std::min(kBlock, n - s);
      uniforms(u, stream, static_cast<uint64_t>(s), m);
      if (exact) {
        for (int64_t j = 0; j < m; ++j) yp[s + j] = u[j] >= pf ? xp[s + j] * scale : T(0);
      } else {
        for (int64_t j = 0; j < m; ++j) yp[s + j] = double(u[j]) >= p ? xp[s + j] * scale : T(0);
      }
    }
  });
}

namespace ref {

void dropout_apply(const Tensor& y, const Tensor& x, double p, const RngStream& stream) {
  std::vector<double> v = x.to_vector();
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = p >= 1.0 ? 0.0 : (double(stream.uniform(i)) >= p ? v[i] / (1.0 - p) : 0.0);
  y.copy_(from_doubles(v, x.shape(), DType::f64));
}

}  // namespace ref
}  // namespace nxd::kernels
