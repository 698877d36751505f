// The paged KV cache (runtime/kernels/kv_cache.h, CausalLM::make_paged_kv_cache) against the
// contiguous one: the same keys read through shuffled block tables give bitwise the same
// attention, and a model's prefill and decode logits are bitwise those of the contiguous path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "nxd/autograd/ops/inference.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/kernels/kv_cache.h"
#include "nxd/runtime/rng.h"
#include "support/compare.h"
#include "support/tiny_models.h"

using namespace nxd;

namespace {

Tensor random_tensor(const Shape& s, DType dt, uint64_t seed) {
  const int64_t n = std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
  std::vector<double> v(n);
  RngStream r{seed, 3};
  for (int64_t i = 0; i < n; ++i) v[i] = r.normal(uint64_t(i));
  return from_vector<double>(v, s).to(dt);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// Copies row `row` of a contiguous cache [Bmax, H, L, D] into the blocks of `table` of a paged
// cache [NB, H, bs, D].
void scatter_row(const Tensor& paged, const Tensor& contig, int64_t row,
                 const std::vector<int64_t>& table, int64_t positions) {
  const int64_t H = contig.size(1), L = contig.size(2), D = contig.size(3), bs = paged.size(2);
  const int64_t es = dtype_size(contig.dtype());
  for (int64_t h = 0; h < H; ++h)
    for (int64_t p = 0; p < positions; ++p)
      std::memcpy(
          static_cast<char*>(paged.raw_data()) + ((table[p / bs] * H + h) * bs + p % bs) * D * es,
          static_cast<const char*>(contig.raw_data()) + ((row * H + h) * L + p) * D * es, D * es);
}

}  // namespace

TEST(PagedAttention, EqualsContiguousBitwiseThroughShuffledTables) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t B = 3, Hq = 4, Hkv = 2, D = 8, L = 40, bs = 4, NB = 40;
    Tensor kc = random_tensor({B, Hkv, L, D}, dt, 1), vc = random_tensor({B, Hkv, L, D}, dt, 2);
    Tensor kp = zeros({NB, Hkv, bs, D}, dt), vp = zeros({NB, Hkv, bs, D}, dt);
    // rows at start 0 (a prefill of 7), 13 (a chunk of 5) and 30 (a decode token)
    const std::vector<int64_t> start = {0, 13, 30}, len = {7, 5, 1};
    const int64_t S = 7;
    std::vector<int64_t> perm(NB);
    std::iota(perm.begin(), perm.end(), 0);
    std::reverse(perm.begin(), perm.end());
    std::rotate(perm.begin(), perm.begin() + 5, perm.end());
    std::vector<std::vector<int64_t>> tables(B);
    int64_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = start[b] + len[b];
      for (int64_t i = 0; i < (n + bs - 1) / bs; ++i) tables[b].push_back(perm[next++]);
      scatter_row(kp, kc, b, tables[b], n);
      scatter_row(vp, vc, b, tables[b], n);
    }
    Tensor q = random_tensor({B, Hq, S, D}, dt, 3);
    CacheStep cs = make_cache_step({0, 1, 2}, start, len);
    CacheStep ps = make_paged_cache_step(tables, start, len);
    NoGradGuard ng;
    Tensor want = cached_attention(q, kc, vc, cs.seq_ids, cs.start, cs.lengths);
    Tensor got = paged_attention(q, kp, vp, ps.block_tables, ps.start, ps.lengths);
    EXPECT_TRUE(bitwise_equal(want, got));
    // the paged write puts x where the contiguous write puts it
    Tensor x = random_tensor({B, Hkv, S, D}, dt, 4);
    kv_cache_write(kc, x, cs.seq_ids, cs.start, cs.lengths);
    paged_kv_cache_write(kp, x, ps.block_tables, ps.start, ps.lengths);
    Tensor back = zeros({NB, Hkv, bs, D}, dt);
    for (int64_t b = 0; b < B; ++b) scatter_row(back, kc, b, tables[b], start[b] + len[b]);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < static_cast<int64_t>(tables[b].size()); ++i)
        EXPECT_TRUE(bitwise_equal(back.select(0, tables[b][i]), kp.select(0, tables[b][i])))
            << "row " << b << " block " << i;
  }
}

// A sliding window reads no block wholly before the row's first query's window: such entries
// may be -1 (a rolling engine returned them), and the result is bitwise the contiguous kernel's
// with the window, and that of tables whose early entries are still valid; against the double
// reference within rounding.
TEST(PagedAttention, ASlidingWindowReadsNoBlockBeforeItsWindow) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t B = 3, Hq = 4, Hkv = 2, D = 8, L = 48, bs = 4, NB = 40, window = 6, S = 5;
    Tensor kc = random_tensor({B, Hkv, L, D}, dt, 11), vc = random_tensor({B, Hkv, L, D}, dt, 12);
    Tensor kp = zeros({NB, Hkv, bs, D}, dt), vp = zeros({NB, Hkv, bs, D}, dt);
    // a decode token at 30 (its window: 25..30, blocks 6-7), a chunk of 5 at 17 (12..21: blocks
    // 3-5), a prefill of 3 at 0 (nothing before it)
    const std::vector<int64_t> start = {30, 17, 0}, len = {1, 5, 3};
    std::vector<std::vector<int64_t>> tables(B), rolled(B);
    int64_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = start[b] + len[b];
      for (int64_t i = 0; i < (n + bs - 1) / bs; ++i) tables[b].push_back((next++ * 7) % NB);
      scatter_row(kp, kc, b, tables[b], n);
      scatter_row(vp, vc, b, tables[b], n);
      rolled[b] = tables[b];
      const int64_t first = std::max<int64_t>(0, start[b] - window + 1);
      for (int64_t i = 0; i < first / bs; ++i) rolled[b][i] = -1;
    }
    EXPECT_EQ(std::count(rolled[0].begin(), rolled[0].end(), -1), 6);
    EXPECT_EQ(std::count(rolled[1].begin(), rolled[1].end(), -1), 3);
    Tensor q = random_tensor({B, Hq, S, D}, dt, 13);
    CacheStep cs = make_cache_step({0, 1, 2}, start, len);
    CacheStep full = make_paged_cache_step(tables, start, len);
    CacheStep roll = make_paged_cache_step(rolled, start, len);
    NoGradGuard ng;
    Tensor want = cached_attention(q, kc, vc, cs.seq_ids, cs.start, cs.lengths, 0.0, window);
    Tensor a = paged_attention(q, kp, vp, full.block_tables, full.start, full.lengths, 0.0, window);
    Tensor b = paged_attention(q, kp, vp, roll.block_tables, roll.start, roll.lengths, 0.0, window);
    EXPECT_TRUE(bitwise_equal(want, a));
    EXPECT_TRUE(bitwise_equal(want, b));
    Tensor ref = zeros({B, Hq, S, D}, DType::f64);
    kernels::ref::cached_attention_forward(ref, q.to(DType::f64), kc.to(DType::f64),
                                           vc.to(DType::f64), cs.seq_ids, cs.start, cs.lengths, 0.0,
                                           window);
    double err = 0;
    const std::vector<double> got = b.contiguous().to_vector(), exact = ref.to_vector();
    for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - exact[i]));
    std::printf("    [%s] window %lld: paged rolled vs double reference %.3g\n", dtype_name(dt),
                (long long)window, err);
    // f32: the kernel's rounding; bf16: the output is rounded to bf16 (half an ulp, 2^-9 relative,
    // of values below 2)
    EXPECT_LT(err, dt == DType::bf16 ? 1e-2 : 1e-5);
    // without the window the same rolled tables are refused, naming the entry
    EXPECT_THROW(paged_attention(q, kp, vp, roll.block_tables, roll.start, roll.lengths), Error);
  }
}

TEST(PagedAttention, BlockTableErrorsNameTheEntry) {
  Tensor kp = zeros({4, 2, 4, 8}), q = zeros({1, 4, 1, 8});
  CacheStep ps = make_paged_cache_step({{0, 9}}, {4}, {1});
  NoGradGuard ng;
  try {
    paged_attention(q, kp, kp, ps.block_tables, ps.start, ps.lengths);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_tables[0, 1]=9 outside the pool of 4"),
              std::string::npos)
        << e.what();
  }
  CacheStep short_table = make_paged_cache_step({{0}}, {4}, {1});
  EXPECT_THROW(
      paged_attention(q, kp, kp, short_table.block_tables, short_table.start, short_table.lengths),
      Error);
}

TEST(PagedAttention, ModelLogitsBitwiseEqualContiguousPath) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    SCOPED_TRACE(arch);
    ModelConfig c = nxd::testing::tiny_model(arch);
    c.max_position_embeddings = 48;
    auto m = make_causal_lm(c, 9);
    const auto prompt = nxd::testing::id_sequence(11, c.vocab_size, 4);
    KVCache contig = m->make_kv_cache(1, 48);
    KVCache paged = m->make_paged_kv_cache(16, 4);
    const std::vector<int64_t> table = {7, 2, 11, 5, 0, 9, 14, 3};  // 32 positions, scattered
    Tensor a = m->forward_cached(from_vector<int64_t>(prompt, {1, 11}),
                                 make_cache_step({0}, {0}, {11}), contig);
    Tensor b = m->forward_cached(from_vector<int64_t>(prompt, {1, 11}),
                                 make_paged_cache_step({table}, {0}, {11}), paged);
    EXPECT_TRUE(bitwise_equal(a, b)) << "prefill";
    std::vector<double> v = a.to_vector();
    int64_t tok = std::max_element(v.begin(), v.end()) - v.begin();
    for (int64_t pos = 11; pos < 30; ++pos) {
      a = m->forward_cached(from_vector<int64_t>({tok}, {1, 1}), make_cache_step({0}, {pos}, {1}),
                            contig);
      b = m->forward_cached(from_vector<int64_t>({tok}, {1, 1}),
                            make_paged_cache_step({table}, {pos}, {1}), paged);
      ASSERT_TRUE(bitwise_equal(a, b)) << "decode at position " << pos;
      v = a.to_vector();
      tok = std::max_element(v.begin(), v.end()) - v.begin();
    }
    // a paged cache needs block tables (and a contiguous one none)
    EXPECT_THROW(m->forward_cached(from_vector<int64_t>({tok}, {1, 1}),
                                   make_cache_step({0}, {30}, {1}), paged),
                 InvalidArgument);
  }
}

// Not bitwise: the projections of a [3, 1] batch run other GEMM shapes than [1, 1] (the engine's
// tests compare tokens, docs/design/inference.md). A chunked prefill runs [1, 8] then [1, 5]
// against [1, 13]: the last row's logits are compared the same way.
TEST(PagedAttention, BatchedAndChunkedLogitsAreCloseToAlone) {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.max_position_embeddings = 48;
  auto m = make_causal_lm(c, 9);
  KVCache paged = m->make_paged_kv_cache(32, 4);
  const std::vector<std::vector<int64_t>> tables = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}};
  const std::vector<int64_t> P = {5, 9, 13};
  for (int b = 0; b < 3; ++b) {
    auto p = nxd::testing::id_sequence(P[b], 64, b);
    m->forward_cached(from_vector<int64_t>(p, {1, P[b]}),
                      make_paged_cache_step({tables[b]}, {0}, {P[b]}), paged);
  }
  Tensor alone = m->forward_cached(from_vector<int64_t>({7}, {1, 1}),
                                   make_paged_cache_step({tables[1]}, {9}, {1}), paged);
  Tensor batch = m->forward_cached(from_vector<int64_t>({3, 7, 9}, {3, 1}),
                                   make_paged_cache_step(tables, P, {1, 1, 1}), paged);
  const Tensor row = batch.select(0, 1).contiguous(), one = alone.select(0, 0).contiguous();
  std::printf("    decode row alone vs in a batch of 3: largest difference %.3g\n",
              nxd::testing::diff(row, one).max_abs);
  EXPECT_TRUE(nxd::testing::close_rel(row, one, 1e-5, "batched"));
  const auto p = nxd::testing::id_sequence(13, 64, 2);
  Tensor whole = m->forward_cached(from_vector<int64_t>(p, {1, 13}),
                                   make_paged_cache_step({tables[0]}, {0}, {13}), paged);
  m->forward_cached(from_vector<int64_t>(std::vector<int64_t>(p.begin(), p.begin() + 8), {1, 8}),
                    make_paged_cache_step({tables[1]}, {0}, {8}), paged);
  Tensor chunked =
      m->forward_cached(from_vector<int64_t>(std::vector<int64_t>(p.begin() + 8, p.end()), {1, 5}),
                        make_paged_cache_step({tables[1]}, {8}, {5}), paged);
  std::printf("    prefill of 13 whole vs chunks of 8 + 5: largest difference %.3g\n",
              nxd::testing::diff(whole, chunked).max_abs);
  EXPECT_TRUE(nxd::testing::close_rel(whole, chunked, 1e-5, "chunked"));
}
