// Buckets: routing to the smallest fitting bucket, padded calls equal unpadded ones, counters,
// one weight copy for all buckets, over-long inputs refused naming the sizes.
#include <gtest/gtest.h>

#include "support/compare.h"
#include "trace_util.h"

using namespace nxd;
using namespace nxd::testing;

TEST(TraceBuckets, AutomaticPowersOfTwo) {
  auto c = trace::BucketConfig::automatic({.min_seq = 100, .max_seq = 1000});
  std::vector<int64_t> seqs;
  for (const auto& b : c.buckets) seqs.push_back(b.seq);
  EXPECT_EQ(seqs, (std::vector<int64_t>{128, 256, 512, 1000}));
}

TEST(TraceBuckets, RoutesPadsAndCounts) {
  if (under_mpi()) GTEST_SKIP() << "sim only";
  for (const std::string arch : {"llama", "gpt_neox"}) {
    SCOPED_TRACE(arch);
    const ModelConfig cfg = trace_config(arch, 1);
    trace::TraceOptions o{
        .tp_degree = 1,
        .bucket_config = trace::BucketConfig::explicit_shapes({{1, 32}, {1, 8}, {2, 16}, {1, 16}})};
    auto tm = trace::parallel_model_trace(causal_lm_fn(cfg), {trace_ids(1, 8, cfg.vocab_size)}, o);
    EXPECT_EQ(tm->route(1, 8), 1u);
    EXPECT_EQ(tm->route(1, 9), 3u);  // [1,16] before [2,16]
    EXPECT_EQ(tm->route(2, 3), 2u);
    EXPECT_EQ(tm->route(1, 17), 0u);
    // a padded call equals the unpadded (exact-shape) one
    auto exact = trace::parallel_model_trace(causal_lm_fn(cfg), {trace_ids(1, 11, cfg.vocab_size)},
                                             trace::TraceOptions{.tp_degree = 1});
    const Tensor ids = trace_ids(1, 11, cfg.vocab_size, 5);
    const Tensor padded = tm->forward({ids})[0];
    EXPECT_EQ(padded.shape(), (Shape{1, 11, cfg.vocab_size}));
    // Padding changes the rows of every product (16 against 11), so the GEMM may round each dot
    // product differently (Eigen's kernel takes a row's k-sum in one or two chains depending on
    // where the row falls; OpenBLAS likewise): a few ulps of the terms' magnitude per product,
    // the same absolute error for a small logit as for a large one. So the bound is relative to
    // the logits' scale (max|a-b| / max|b|), not to each logit: measured 7.4e-7 on an AVX2 build,
    // where the per-element form (1e-6 + 1e-6 |b|) failed on a logit of 0.085 by 2.6e-6.
    EXPECT_CLOSE_REL(padded, exact->forward({ids})[0], 2e-6);
    EXPECT_EQ(tm->stats()[3].calls, 1);
    EXPECT_EQ(tm->stats()[3].real_tokens, 11);
    EXPECT_EQ(tm->stats()[3].padded_tokens, 5);
    // over-long input: a clear error naming both
    try {
      tm->forward({trace_ids(1, 33, cfg.vocab_size)});
      FAIL() << "no error";
    } catch (const ShapeError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("seq=33"), std::string::npos) << m;
      EXPECT_NE(m.find("[1,32]"), std::string::npos) << m;
    }
  }
}

TEST(TraceBuckets, OneWeightCopyForAllBuckets) {
  if (under_mpi()) GTEST_SKIP() << "sim only";
  const ModelConfig cfg = trace_config("llama", 2);
  auto one = trace::parallel_model_trace(causal_lm_fn(cfg), {trace_ids(1, 8, cfg.vocab_size)},
                                         trace::TraceOptions{.tp_degree = 2});
  auto four = trace::parallel_model_trace(
      causal_lm_fn(cfg), {trace_ids(1, 8, cfg.vocab_size)},
      trace::TraceOptions{
          .tp_degree = 2,
          .bucket_config = trace::BucketConfig::automatic({.min_seq = 8, .max_seq = 64})});
  ASSERT_EQ(four->buckets().size(), 4u);
  for (const Tensor& ids : {trace_ids(1, 8, 64), trace_ids(1, 60, 64)}) {
    one->forward({trace_ids(1, 8, 64)});
    four->forward({ids});
  }
  int64_t wbytes = 0;
  for (const auto& r : four->ranks())
    for (const auto& kv : r.weights) wbytes += kv.second.nbytes();
  auto arenas = [](const trace::TensorParallelModel& m) {
    int64_t n = 0;
    for (const auto& r : m.ranks())
      for (const auto& g : r.graphs) n += g->plan.arena_bytes;
    return n;
  };
  // four buckets hold the weights once: besides them only the graphs' arenas
  EXPECT_EQ(four->resident_bytes() - arenas(*four), wbytes);
  EXPECT_EQ(one->resident_bytes() - arenas(*one), wbytes);
  EXPECT_GT(arenas(*four), arenas(*one));
}
