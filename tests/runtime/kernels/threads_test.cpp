// Every kernel that runs on the compute pool gives bitwise the same results at 1 and 2 threads
// (and across repeated runs). Sizes are large enough that the kernels do split.
#include <gtest/gtest.h>

#include <functional>
#include <tuple>
#include <vector>

#include "nxd/runtime/context.h"
#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/activation.h"
#include "nxd/runtime/kernels/attention.h"
#include "nxd/runtime/kernels/cross_entropy.h"
#include "nxd/runtime/kernels/elementwise.h"
#include "nxd/runtime/kernels/embedding.h"
#include "nxd/runtime/kernels/flash_attention.h"
#include "nxd/runtime/kernels/norm.h"
#include "nxd/runtime/kernels/rotary.h"
#include "nxd/runtime/kernels/softmax.h"
#include "nxd/runtime/parallel.h"
#include "support/compare.h"
#include "support/random.h"
#include "support/threads.h"

using namespace nxd;
namespace k = nxd::kernels;

namespace {

Tensor randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  return nxd::testing::randn_from(s, dt, {seed, 31}, std);
}

using nxd::testing::expect_thread_invariant;

class KernelThreads : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(Dtypes, KernelThreads, ::testing::Values(DType::f32, DType::f64),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

}  // namespace

TEST_P(KernelThreads, Elementwise) {
  const DType dt = GetParam();
  // a ragged size, and an unaligned view (offset 1) for Eigen's transcendental path
  Tensor a = randn({300001}, dt, 1), b = randn({300001}, dt, 2);
  Tensor av = randn({300002}, dt, 3).slice(0, 1, 300002);
  expect_thread_invariant([&] {
    std::vector<Tensor> r;
    for (k::Unary op : {k::Unary::exp, k::Unary::tanh, k::Unary::neg, k::Unary::square}) {
      for (const Tensor& x : {a, av}) {
        Tensor y = empty_like(x);
        k::unary(y, x, op);
        r.push_back(y);
      }
    }
    Tensor s = empty_like(a), dx = empty_like(a);
    k::binary(s, a, b, k::Binary::add);
    k::unary_backward(dx, b, Tensor(), s, k::Unary::tanh);
    r.push_back(s);
    r.push_back(dx);
    return r;
  });
}

TEST_P(KernelThreads, Activations) {
  const DType dt = GetParam();
  Tensor x = randn({77, 2049}, dt, 4, 3.0), u = randn({77, 2049}, dt, 5),
         g = randn({77, 2049}, dt, 6);
  expect_thread_invariant([&] {
    std::vector<Tensor> r;
    for (bool th : {true, false}) {
      Tensor y = empty_like(x), dx = empty_like(x);
      k::gelu_forward(y, x, th);
      k::gelu_backward(dx, g, x, th);
      r.insert(r.end(), {y, dx});
    }
    Tensor y = empty_like(x), dx = empty_like(x), sw = empty_like(x), dg = empty_like(x),
           du = empty_like(x);
    k::silu_forward(y, x);
    k::silu_backward(dx, g, x);
    k::swiglu_forward(sw, x, u);
    k::swiglu_backward(dg, du, g, x, u);
    r.insert(r.end(), {y, dx, sw, dg, du});
    return r;
  });
}

TEST_P(KernelThreads, Softmax) {
  const DType dt = GetParam();
  Tensor x = randn({3, 257, 257}, dt, 7, 2.0), g = randn({3, 257, 257}, dt, 8);
  expect_thread_invariant([&] {
    Tensor y = empty_like(x), yc = empty_like(x), ls = empty_like(x), dx = empty_like(x),
           dl = empty_like(x);
    k::softmax_forward(y, x, 0.5);
    k::softmax_forward(yc, x, 1.0, /*causal=*/true);
    k::log_softmax_forward(ls, x);
    k::softmax_backward(dx, g, y, 0.5);
    k::log_softmax_backward(dl, g, ls);
    return std::vector<Tensor>{y, yc, ls, dx, dl};
  });
}

TEST_P(KernelThreads, Norms) {
  const DType dt = GetParam();
  // 1000 rows: 15 full 64-row chunks of the weight gradient and a partial one
  const int64_t rows = 1000, d = 384;
  Tensor x = randn({rows, d}, dt, 9), g = randn({rows, d}, dt, 10), w = randn({d}, dt, 11),
         b = randn({d}, dt, 12);
  expect_thread_invariant([&] {
    Tensor y = empty_like(x), mean = empty({rows}, dt), rstd = empty({rows}, dt);
    k::layer_norm_forward(y, mean, rstd, x, w, b, 1e-5);
    Tensor dx = empty_like(x), dw = empty({d}, dt), db = empty({d}, dt);
    k::layer_norm_backward(dx, dw, db, g, x, mean, rstd, w);
    Tensor ry = empty_like(x), rr = empty({rows}, dt), rdx = empty_like(x), rdw = empty({d}, dt);
    k::rms_norm_forward(ry, rr, x, w, 1e-6);
    k::rms_norm_backward(rdx, rdw, g, x, rr, w);
    return std::vector<Tensor>{y, mean, rstd, dx, dw, db, ry, rr, rdx, rdw};
  });
}

TEST_P(KernelThreads, NormWeightGradientMatchesReference) {
  // the chunked weight-gradient sums still match the double reference
  const DType dt = GetParam();
  const int64_t rows = 1000, d = 64;
  Tensor x = randn({rows, d}, dt, 13), g = randn({rows, d}, dt, 14), w = randn({d}, dt, 15);
  Tensor rstd = empty({rows}, dt), y = empty_like(x);
  k::rms_norm_forward(y, rstd, x, w, 1e-6);
  Tensor dx = empty_like(x), dw = empty({d}, dt), rdx = empty_like(x), rdw = empty({d}, dt);
  k::rms_norm_backward(dx, dw, g, x, rstd, w);
  k::ref::rms_norm_backward(rdx, rdw, g, x, rstd, w);
  const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
  EXPECT_CLOSE_REL(dw, rdw, tol);
  EXPECT_CLOSE_REL(dx, rdx, tol);
}

TEST_P(KernelThreads, Rotary) {
  const DType dt = GetParam();
  // [B, S, H, D] memory viewed as [B, H, S, D], as the attention projections produce it
  Tensor x = randn({4, 128, 6, 64}, dt, 16).transpose(1, 2);
  expect_thread_invariant([&] {
    Tensor y = empty({4, 6, 128, 64}, dt), yp = empty({4, 6, 128, 64}, dt);
    k::rotary_forward(y, x, 0, 10000.0, 0, k::RotaryDirection::forward);
    k::rotary_forward(yp, x, 16, 10000.0, 3, k::RotaryDirection::inverse);
    return std::vector<Tensor>{y, yp};
  });
}

TEST_P(KernelThreads, CrossEntropyAndEmbedding) {
  const DType dt = GetParam();
  const int64_t n = 500, v = 301, d = 256;
  Tensor logits = randn({n, v}, dt, 17, 3.0);
  std::vector<double> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 7 == 3 ? -100 : (i * 37) % v;
  Tensor tg = from_doubles(t, {n}, DType::i64), dloss = randn({n}, dt, 18);
  // repeated ids: dweight rows receive several rows each
  std::vector<double> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = (i * 13) % 97;
  Tensor id = from_doubles(ids, {n}, DType::i64), w = randn({97, d}, dt, 19),
         dy = randn({n, d}, dt, 20);
  expect_thread_invariant([&] {
    Tensor loss = empty({n}, dt), lse = empty({n}, dt), dl = empty({n, v}, dt);
    EXPECT_EQ(k::cross_entropy_forward(loss, lse, logits, tg, -100, 0.1), n - (n + 3) / 7);
    k::cross_entropy_backward(dl, dloss, logits, lse, tg, -100, 0.1);
    Tensor y = empty({n, d}, dt), dw = zeros({97, d}, dt);
    k::embedding_forward(y, id, w);
    k::embedding_backward(dw, dy, id);
    return std::vector<Tensor>{loss, lse, dl, y, dw};
  });
}

TEST_P(KernelThreads, Attention) {
  const DType dt = GetParam();
  const int64_t B = 2, hq = 4, hkv = 2, s = 160, D = 32;
  Tensor q = randn({B, hq, s, D}, dt, 21), kk = randn({B, hkv, s, D}, dt, 22),
         v = randn({B, hkv, s, D}, dt, 23), g = randn({B, hq, s, D}, dt, 24);
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    expect_thread_invariant([&] {
      Tensor o = empty({B, hq, s, D}, dt), p = empty({B, hq, s, s}, dt),
             o2 = empty({B, hq, s, D}, dt);
      k::attention_forward(o, p, q, kk, v, causal, 0);
      k::attention_forward(o2, Tensor(), q, kk, v, causal, 0);  // no probs kept
      Tensor dq = empty_like(q), dk = empty_like(kk), dv = empty_like(v);
      k::attention_backward(dq, dk, dv, g, q, kk, v, o, p, causal, 0);
      return std::vector<Tensor>{o, p, o2, dq, dk, dv};
    });
  }
}

TEST_P(KernelThreads, FlashDocumentAttention) {
  // packed documents (70, 3, 60, 17 rows: across the 64-row blocks), both backward schedules
  const DType dt = GetParam();
  const int64_t B = 2, hq = 4, hkv = 2, s = 150, D = 32;
  std::vector<int64_t> pos;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n : {70, 3, 60, 17})
      for (int64_t i = 0; i < n; ++i) pos.push_back(i);
  const Tensor positions = from_vector<int64_t>(pos, {B, s});
  Tensor q = randn({B, hq, s, D}, dt, 35), kk = randn({B, hkv, s, D}, dt, 36),
         v = randn({B, hkv, s, D}, dt, 37), g = randn({B, hq, s, D}, dt, 38);
  for (auto sched : {k::FlashBackwardSchedule::one_pass, k::FlashBackwardSchedule::two_pass}) {
    k::set_flash_backward_schedule(sched);
    expect_thread_invariant([&] {
      Tensor o = empty({B, hq, s, D}, dt), lse = empty({B, hq, s}, dt);
      k::flash_document_attention_forward(o, lse, q, kk, v, positions, 0);
      Tensor dq = empty_like(q), dk = empty_like(kk), dv = empty_like(v);
      k::flash_document_attention_backward(dq, dk, dv, g, q, kk, v, o, lse, positions, 0);
      return std::vector<Tensor>{o, lse, dq, dk, dv};
    });
  }
  k::set_flash_backward_schedule(k::FlashBackwardSchedule::one_pass);
}

TEST_P(KernelThreads, FlashAttention) {
  const DType dt = GetParam();
  // 3 query blocks, the last one short; Sk > Sq; GQA 2 and 4 (forward units per query block,
  // backward units per kv head; B * Hkv = 1 also with the two-pass backward, whose units are
  // per key block and per query block)
  // (and a sliding window of 70: blocks skipped on both sides)
  const int64_t hq = 4, sq = 150, sk = 170, D = 48;
  for (auto [B, hkv, causal, window] : {std::tuple<int64_t, int64_t, bool, int64_t>{2, 2, true, 0},
                                        {2, 2, false, 0},
                                        {1, 1, true, 0},
                                        {1, 1, false, 0},
                                        {2, 2, true, 70},
                                        {1, 1, true, 70}}) {
    SCOPED_TRACE(str(causal ? "causal" : "full", " B=", B, " Hkv=", hkv, " window=", window));
    Tensor q = randn({B, hq, sq, D}, dt, 25), kk = randn({B, hkv, sk, D}, dt, 26),
           v = randn({B, hkv, sk, D}, dt, 27), g = randn({B, hq, sq, D}, dt, 28);
    k::set_flash_backward_schedule(B == 1 ? k::FlashBackwardSchedule::two_pass
                                          : k::FlashBackwardSchedule::one_pass);
    expect_thread_invariant([&] {
      Tensor o = empty({B, hq, sq, D}, dt), lse = empty({B, hq, sq}, dt);
      k::flash_attention_forward(o, lse, q, kk, v, causal, 0, window);
      Tensor dq = empty_like(q), dk = empty_like(kk), dv = empty_like(v);
      k::flash_attention_backward(dq, dk, dv, g, q, kk, v, o, lse, causal, 0, window);
      return std::vector<Tensor>{o, lse, dq, dk, dv};
    });
    k::set_flash_backward_schedule(k::FlashBackwardSchedule::one_pass);
  }
}
