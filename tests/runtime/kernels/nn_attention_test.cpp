#include <gtest/gtest.h>

#include <cmath>

#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/attention.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
namespace k = nxd::kernels;

namespace {
Tensor randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  return nxd::testing::randn_from(s, dt, {seed, 14}, std);
}
}  // namespace

struct AttnCase {
  int64_t hq, hkv, sq, sk;
  bool causal;
};

class NnAttention : public ::testing::TestWithParam<AttnCase> {};
INSTANTIATE_TEST_SUITE_P(Heads, NnAttention,
                         ::testing::Values(AttnCase{4, 4, 6, 6, true}, AttnCase{4, 2, 6, 6, true},
                                           AttnCase{4, 1, 5, 5, true}, AttnCase{4, 2, 5, 5, false},
                                           AttnCase{2, 1, 3, 7, true},
                                           // several 128-row causal blocks, and Sk > Sq
                                           AttnCase{2, 1, 200, 200, true},
                                           AttnCase{2, 1, 150, 260, true},
                                           AttnCase{2, 2, 130, 130, false}));

TEST_P(NnAttention, ForwardBackwardMatchReference) {
  auto c = GetParam();
  const int64_t B = 2, D = 8;
  for (DType dt : {DType::f32, DType::f64}) {
    double tl = dt == DType::f64 ? 1e-12 : 3e-6;
    Tensor q = randn({B, c.hq, c.sq, D}, dt, 1), kk = randn({B, c.hkv, c.sk, D}, dt, 2),
           v = randn({B, c.hkv, c.sk, D}, dt, 3), dout = randn({B, c.hq, c.sq, D}, dt, 4);
    Tensor o = empty_like(q), p = empty({B, c.hq, c.sq, c.sk}, dt);
    Tensor orf = empty_like(q), prf = empty({B, c.hq, c.sq, c.sk}, dt);
    k::attention_forward(o, p, q, kk, v, c.causal, 0.0);
    k::ref::attention_forward(orf, prf, q, kk, v, c.causal, 0.0);
    EXPECT_CLOSE_REL(o, orf, tl);
    EXPECT_CLOSE_REL(p, prf, tl);
    if (c.causal) {
      EXPECT_EQ(p.at({1, 0, 0, c.sk - c.sq + 1}), 0.0);
    }
    Tensor dq = empty_like(q), dk = empty_like(kk), dv = empty_like(v);
    Tensor dqr = empty_like(q), dkr = empty_like(kk), dvr = empty_like(v);
    k::attention_backward(dq, dk, dv, dout, q, kk, v, o, p, c.causal, 0.0);
    k::ref::attention_backward(dqr, dkr, dvr, dout, q, kk, v, o, p, c.causal, 0.0);
    EXPECT_CLOSE_REL(dq, dqr, 4 * tl);
    EXPECT_CLOSE_REL(dk, dkr, 4 * tl);
    EXPECT_CLOSE_REL(dv, dvr, 4 * tl);
    // without saved probabilities (inference) the output is the same (BLAS may round
    // differently for another buffer alignment)
    Tensor o2 = empty_like(q);
    k::attention_forward(o2, Tensor(), q, kk, v, c.causal, 0.0);
    EXPECT_CLOSE_REL(o2, o, tl);
  }
}

TEST(NnAttentionMisc, StridedOperandsWithoutCopies) {
  // [B, S, H, D] projections viewed as [B, H, S, D], and an output written in [B, S, H, D]
  const int64_t B = 2, S = 5, H = 4, Hkv = 2, D = 4;
  Tensor qs = randn({B, S, H, D}, DType::f32, 5), ks = randn({B, S, Hkv, D}, DType::f32, 6),
         vs = randn({B, S, Hkv, D}, DType::f32, 7);
  Tensor q = qs.transpose(1, 2), kk = ks.transpose(1, 2), v = vs.transpose(1, 2);
  Tensor out_bshd = empty({B, S, H, D}), o = out_bshd.transpose(1, 2), p = empty({B, H, S, S});
  k::attention_forward(o, p, q, kk, v, true, 0.3);
  Tensor r = empty({B, H, S, D}), pr = empty({B, H, S, S});
  k::ref::attention_forward(r, pr, q, kk, v, true, 0.3);
  EXPECT_CLOSE_REL(o.contiguous(), r, 3e-6);
  Tensor dout = randn({B, H, S, D}, DType::f32, 8);
  Tensor dqs = empty({B, S, H, D}), dq = dqs.transpose(1, 2), dk = empty({B, Hkv, S, D}),
         dv = empty({B, Hkv, S, D});
  k::attention_backward(dq, dk, dv, dout, q, kk, v, o, p, true, 0.3);
  Tensor dqr = empty({B, H, S, D}), dkr = empty_like(dk), dvr = empty_like(dv);
  k::ref::attention_backward(dqr, dkr, dvr, dout, q, kk, v, o, p, true, 0.3);
  EXPECT_CLOSE_REL(dq.contiguous(), dqr, 1e-5);
  EXPECT_CLOSE_REL(dk, dkr, 1e-5);
  EXPECT_CLOSE_REL(dv, dvr, 1e-5);
}

TEST(NnAttentionMisc, ErrorsAndMeta) {
  Tensor q = zeros({1, 4, 3, 8}), kk = zeros({1, 3, 3, 8}), o = empty_like(q);
  try {
    k::attention_forward(o, Tensor(), q, kk, kk, true, 0.0);
    FAIL();
  } catch (const ShapeError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[attention_forward] kv heads 3 do not divide query heads 4"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("f32[1,4,3,8]"), std::string::npos) << m;
  }
  Tensor mq = empty({2, 8, 16, 4}, DType::f32, Device::meta),
         mk = empty({2, 2, 16, 4}, DType::f32, Device::meta), mo = empty_like(mq),
         mp = empty({2, 8, 16, 16}, DType::f32, Device::meta);
  k::attention_forward(mo, mp, mq, mk, mk, true, 0.0);
  EXPECT_TRUE(mo.is_meta());
}
