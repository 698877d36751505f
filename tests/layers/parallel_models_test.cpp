// Tensor-, sequence-parallel and KV-replicated Llama / GPT-NeoX against the single-rank model:
// the TP=1 model is built on one rank, the TP=2/4 model on run_ranks(tp) with the same config
// and seed; the loss, the logits and every parameter and gradient gathered to its full shape
// (matched by name) must agree within 1e-5 relative (max|a-b| / max|b|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/layers/transformer.h"
#include "support/compare.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

using namespace nxd;
using nxd::testing::run_ranks;

namespace {

constexpr double kTol = 1e-5;

ModelConfig llama(int64_t kv_heads) {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.vocab_size = 32;
  c.num_kv_heads = kv_heads;
  return c;
}

ModelConfig neox() {
  ModelConfig c = nxd::testing::tiny_model("gpt_neox");
  c.vocab_size = 32;
  return c;
}

// `arch` at TP 4: Llama with 2 KV heads, replicated twice, or GPT-NeoX.
ModelConfig tp4_config(const std::string& arch) {
  ModelConfig c = arch == "llama" ? llama(2) : neox();
  c.kv_size_multiplier = arch == "llama" ? 2 : 1;
  return c;
}

Tensor some_ids(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  RngStream s{seed, 77};
  std::vector<int64_t> v(B * S);
  for (int64_t i = 0; i < B * S; ++i) v[i] = static_cast<int64_t>(s.uniform_f64(i) * vocab);
  return from_vector<int64_t>(v, {B, S});
}

struct Case {
  std::string what;
  ModelConfig cfg;
  int tp = 2;
  int64_t B = 2, S = 8;
  Reduction reduction = Reduction::mean;
  double label_smoothing = 0.0;
  bool via_forward = false;  // loss = cross_entropy(forward(ids)) on every rank (full logits)
  int64_t generate = 0;      // greedy tokens to compare (0: none)
};

struct Result {
  Tensor loss, logits;
  std::vector<std::string> names;
  std::map<std::string, Tensor> weights, grads;
  std::vector<int64_t> generated;
};

Tensor targets_of(const Case& c) {
  Tensor t = some_ids(c.B, c.S, c.cfg.vocab_size, 9);
  t.set({0, 1}, -100);  // ignored
  t.set({c.B - 1, c.S - 1}, -100);
  return t;
}

// loss (and its backward) the way the case asks.
Tensor case_loss(CausalLM& m, const Case& c, const Tensor& ids, const Tensor& tg) {
  CrossEntropyOptions o;
  o.reduction = c.reduction;
  o.label_smoothing = c.label_smoothing;
  Tensor l;
  if (c.via_forward) {
    const int64_t n = c.B * c.S;
    l = cross_entropy(view(m.forward(ids), {n, c.cfg.vocab_size}), tg.reshape({n}), o);
  } else {
    l = m.loss(ids, tg, o);
  }
  Tensor scalar = c.reduction == Reduction::none ? sum(l, {0}) : l;
  backward(scalar);
  return l.detach();
}

Result run_model(CausalLM& m, const Case& c) {
  Result r;
  Tensor ids = some_ids(c.B, c.S, c.cfg.vocab_size, 3);
  r.loss = case_loss(m, c, ids, targets_of(c));
  {
    NoGradGuard ng;
    r.logits = m.forward(ids);
  }
  if (c.generate > 0) {
    GenerateOptions go;
    go.max_new_tokens = c.generate;
    go.temperature = 0;
    r.generated = m.generate({1, 5, 7}, go);
  }
  return r;
}

// The single-rank model, on one fresh rank (same Context seed as the parallel ranks).
Result reference(const Case& c) {
  Result r;
  run_ranks(1, [&] {
    auto m = make_causal_lm(c.cfg, 17);
    EXPECT_EQ(m->tensor_parallel_size(), 1);
    r = run_model(*m, c);
    for (auto& [name, t] : m->named_parameters()) {
      r.names.push_back(name);
      r.weights[name] = t.detach().clone();
      EXPECT_TRUE(t.grad().defined()) << name;
      if (t.grad().defined()) r.grads[name] = t.grad().clone();
    }
  });
  return r;
}

// A parameter (or its gradient) gathered to the full shape of the TP=1 parameter of that name.
// K/V replicas: the gathered rows are m copies of every block; all copies must be identical and
// the full tensor is the first copy of each block.
Tensor gather_full(Communicator& g, const Tensor& t, const ParallelAttrs& a,
                   const std::string& what) {
  if (!a.tensor_model_parallel) return t.detach();
  EXPECT_EQ(a.partition_stride, 1) << what;
  Tensor all = g.all_gather(t.detach().contiguous(), a.partition_dim);
  const int64_t m = a.kv_replicas;
  if (m == 1) return all;
  EXPECT_EQ(a.partition_dim, 0) << what;
  const int64_t tp = g.size(), p = t.size(0);
  Shape s = all.shape();
  Shape blocks{tp / m, m, p};
  blocks.insert(blocks.end(), s.begin() + 1, s.end());
  Tensor v = all.view(blocks);
  for (int64_t i = 1; i < m; ++i)
    EXPECT_TRUE(nxd::testing::bitwise_equal(v.select(1, i).contiguous(),
                                            v.select(1, 0).contiguous(),
                                            what + " replica " + std::to_string(i)));
  Shape full = s;
  full[0] = tp / m * p;
  return v.select(1, 0).contiguous().reshape(full);
}

struct Worst {
  std::mutex mu;
  double rel = 0;
  std::string what;
  void add(const Tensor& a, const Tensor& b, const std::string& w) {
    EXPECT_TRUE(nxd::testing::close_rel(a, b, kTol, w));
    if (a.shape() != b.shape()) return;
    double r = nxd::testing::diff(a, b).rel();
    std::lock_guard<std::mutex> g(mu);
    if (r > rel || what.empty()) rel = r, what = w;
  }
};

void check_case(const Case& c) {
  SCOPED_TRACE(c.what);
  const Result ref = reference(c);
  Worst worst;
  double loss_rel = 0;
  run_ranks(c.tp, [&] {
    parallel_state::initialize_model_parallel(c.tp);
    Communicator& g = parallel_state::get_tensor_model_parallel_group();
    auto m = make_causal_lm(c.cfg, 17);
    EXPECT_EQ(m->tensor_parallel_size(), c.tp);
    EXPECT_EQ(m->sequence_parallel(), c.cfg.sequence_parallel);
    Result r = run_model(*m, c);
    allreduce_sequence_parallel_gradients(*m);

    worst.add(r.loss, ref.loss, "loss");
    if (g.rank() == 0) loss_rel = nxd::testing::diff(r.loss, ref.loss).rel();
    worst.add(r.logits, ref.logits, "logits");
    EXPECT_EQ(r.generated, ref.generated);

    std::vector<std::string> names;
    for (const auto& pp : parallel_parameters(*m)) {
      names.push_back(pp.name);
      auto it = ref.weights.find(pp.name);
      if (it == ref.weights.end()) {
        ADD_FAILURE() << "parameter " << pp.name << " is not in the TP=1 model";
        continue;
      }
      // the shard is exactly the slice of the TP=1 parameter (init by name)
      EXPECT_TRUE(nxd::testing::bitwise_equal(gather_full(g, pp.tensor, pp.attrs, pp.name),
                                              it->second, pp.name));
      if (!pp.tensor.grad().defined()) {
        ADD_FAILURE() << "no gradient for " << pp.name;
        continue;
      }
      worst.add(gather_full(g, pp.tensor.grad(), pp.attrs, pp.name + ".grad"),
                ref.grads.at(pp.name), pp.name + ".grad");
    }
    EXPECT_EQ(names, ref.names);
  });
  std::printf("    [%s] loss rel diff %.3g; largest relative difference %.3g (%s)\n",
              c.what.c_str(), loss_rel, worst.rel, worst.what.c_str());
}

std::string error_of(const ModelConfig& cfg, int tp) {
  std::string msg;
  try {
    run_ranks(tp, [&] {
      parallel_state::initialize_model_parallel(tp);
      make_causal_lm(cfg, 1);
    });
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  return msg;
}

}  // namespace

TEST(ParallelModels, LlamaGQAMatchesSingleRank) {
  for (int tp : {2, 4}) {
    for (bool sp : {false, true}) {
      Case c;
      c.cfg = llama(2);
      c.cfg.sequence_parallel = sp;
      c.cfg.kv_size_multiplier = std::max(1, tp / 2);  // TP 4 > 2 kv heads: replicate twice
      c.tp = tp;
      c.what = "llama kv=2 m=" + std::to_string(c.cfg.kv_size_multiplier) +
               " tp=" + std::to_string(tp) + (sp ? " sp" : "");
      check_case(c);
    }
  }
}

TEST(ParallelModels, LlamaOneKvHeadReplicatedOverFourRanks) {
  for (bool sp : {false, true}) {
    Case c;
    c.cfg = llama(1);
    c.cfg.sequence_parallel = sp;
    c.cfg.kv_size_multiplier = 4;
    c.tp = 4;
    c.what = std::string("llama kv=1 m=4 tp=4") + (sp ? " sp" : "");
    check_case(c);
  }
}

TEST(ParallelModels, LlamaMultiHeadTiedEmbeddings) {
  for (bool sp : {false, true}) {
    Case c;
    c.cfg = llama(4);
    c.cfg.tie_word_embeddings = true;
    c.cfg.sequence_parallel = sp;
    c.tp = 4;
    c.what = std::string("llama mha tied tp=4") + (sp ? " sp" : "");
    check_case(c);
  }
}

// The llama-family variants (Qwen2's q/k/v biases, Qwen3's q_norm/k_norm with head_dim apart
// from hidden / heads, Mistral's sliding window) at TP 2 and 4, with and without SP, generating
// too: Qwen3's q_norm/k_norm weights are whole on every rank and their partial gradients are summed
// over TP like SP norms'.
TEST(ParallelModels, QwenAndMistralMatchSingleRank) {
  for (std::string arch : {"qwen2", "qwen3", "mistral"}) {
    for (int tp : {2, 4}) {
      for (bool sp : {false, true}) {
        Case c;
        c.cfg = llama(2);
        c.cfg.arch = arch;
        c.cfg.qkv_bias = arch == "qwen2";
        c.cfg.qk_norm = arch == "qwen3";
        if (arch == "qwen3") c.cfg.attention_head_dim = 16;
        c.cfg.sliding_window = arch == "qwen3" ? 0 : 3;  // S = 8: the window matters
        c.cfg.sequence_parallel = sp;
        c.cfg.kv_size_multiplier = std::max(1, tp / 2);
        c.tp = tp;
        c.generate = 6;
        c.what = arch + " tp=" + std::to_string(tp) + (sp ? " sp" : "");
        check_case(c);
      }
    }
  }
}

TEST(ParallelModels, GPTNeoXMatchesSingleRank) {
  for (int tp : {2, 4}) {
    for (bool sp : {false, true}) {
      Case c;
      c.cfg = neox();
      c.cfg.sequence_parallel = sp;
      c.tp = tp;
      c.what = "gpt_neox tp=" + std::to_string(tp) + (sp ? " sp" : "");
      check_case(c);
    }
  }
}

TEST(ParallelModels, GPTNeoXSequentialResidualTiedTanh) {
  Case c;
  c.cfg = neox();
  c.cfg.use_parallel_residual = false;
  c.cfg.tie_word_embeddings = true;
  c.cfg.gelu_tanh = true;
  c.cfg.sequence_parallel = true;
  c.tp = 4;
  c.what = "gpt_neox sequential tied tanh tp=4 sp";
  check_case(c);
}

TEST(ParallelModels, SequenceNotDivisibleIsPaddedAndLossOptions) {
  // S = 6 at TP 4 under SP: padded to 8 inside, dropped from every result; per-token losses
  // (reduction none), sum, label smoothing.
  for (std::string arch : {"llama", "gpt_neox"}) {
    Case c;
    c.cfg = tp4_config(arch);
    c.cfg.sequence_parallel = true;
    c.tp = 4;
    c.S = 6;
    c.reduction = Reduction::none;
    c.what = arch + " tp=4 sp S=6 per-token";
    check_case(c);
    c.reduction = Reduction::sum;
    c.label_smoothing = 0.1;
    c.what = arch + " tp=4 sp S=6 sum smoothing";
    check_case(c);
  }
}

TEST(ParallelModels, FullLogitsAndHiddenStatesAreDifferentiableAndGenerate) {
  // forward() returns the gathered logits; a loss computed on them identically on every rank
  // backpropagates to the same gradients. Greedy generation (prompt 3, then 4..7 ids: padded
  // under SP) gives the single-rank tokens.
  for (std::string arch : {"llama", "gpt_neox"}) {
    for (bool sp : {false, true}) {
      Case c;
      c.cfg = tp4_config(arch);
      c.cfg.sequence_parallel = sp;
      c.tp = 4;
      c.via_forward = true;
      c.generate = 5;
      c.what = arch + " tp=4 via forward + generate" + (sp ? " sp" : "");
      check_case(c);
    }
  }
}

TEST(ParallelModels, OneTensorParallelRankIsThePlainModel) {
  // TP = 1 inside a 2-rank world (DP 2), and parallel_state not initialized: the plain model,
  // bitwise (same names, same values, same loss and gradients).
  for (std::string arch : {"llama", "gpt_neox"}) {
    Case c;
    c.cfg = arch == "llama" ? llama(2) : neox();
    c.cfg.sequence_parallel = true;  // no effect at TP 1
    c.cfg.kv_size_multiplier = 2;    // no effect at TP 1
    const Result ref = reference(c);
    for (bool init : {true, false}) {
      run_ranks(2, [&] {
        if (init) parallel_state::initialize_model_parallel(1);
        auto m = make_causal_lm(c.cfg, 17);
        EXPECT_EQ(m->tensor_parallel_size(), 1);
        EXPECT_FALSE(m->sequence_parallel());
        Result r = run_model(*m, c);
        EXPECT_TRUE(nxd::testing::bitwise_equal(r.loss, ref.loss, arch + " loss"));
        EXPECT_TRUE(nxd::testing::bitwise_equal(r.logits, ref.logits, arch + " logits"));
        std::vector<std::string> names;
        for (const auto& pp : parallel_parameters(*m)) {
          names.push_back(pp.name);
          EXPECT_FALSE(pp.attrs.tensor_model_parallel || pp.attrs.sequence_parallel_enabled)
              << pp.name;
          EXPECT_TRUE(
              nxd::testing::bitwise_equal(pp.tensor.detach(), ref.weights.at(pp.name), pp.name));
          EXPECT_TRUE(nxd::testing::bitwise_equal(pp.tensor.grad(), ref.grads.at(pp.name),
                                                  pp.name + ".grad"));
        }
        EXPECT_EQ(names, ref.names);
      });
    }
  }
}

TEST(ParallelModels, ParallelAttributesOfTheShards) {
  run_ranks(4, [] {
    parallel_state::initialize_model_parallel(4);
    ModelConfig c = llama(2);
    c.kv_size_multiplier = 2;
    c.sequence_parallel = true;
    auto m = make_causal_lm(c, 1);
    std::map<std::string, ParallelAttrs> a;
    for (const auto& pp : parallel_parameters(*m)) a[pp.name] = pp.attrs;
    auto tp = [&](const std::string& n, int64_t dim, int64_t kv) {
      ASSERT_TRUE(a.count(n)) << n;
      EXPECT_TRUE(a[n].tensor_model_parallel) << n;
      EXPECT_EQ(a[n].partition_dim, dim) << n;
      EXPECT_EQ(a[n].kv_replicas, kv) << n;
    };
    tp("model.embed_tokens.weight", 0, 1);
    tp("model.layers.0.self_attn.q_proj.weight", 0, 1);
    tp("model.layers.0.self_attn.k_proj.weight", 0, 2);
    tp("model.layers.0.self_attn.v_proj.weight", 0, 2);
    tp("model.layers.0.self_attn.o_proj.weight", 1, 1);
    tp("model.layers.1.mlp.gate_proj.weight", 0, 1);
    tp("model.layers.1.mlp.up_proj.weight", 0, 1);
    tp("model.layers.1.mlp.down_proj.weight", 1, 1);
    tp("lm_head.weight", 0, 1);
    for (auto n : {"model.layers.0.input_layernorm.weight",
                   "model.layers.1.post_attention_layernorm.weight", "model.norm.weight"}) {
      EXPECT_FALSE(a[n].tensor_model_parallel) << n;
      EXPECT_TRUE(a[n].sequence_parallel_enabled) << n;
    }
    EXPECT_EQ(m->get_parameter("model.layers.0.self_attn.k_proj.weight").shape(),
              (Shape{8, 32}));  // 2 kv heads x 2 replicas / 4 ranks = 1 head of 8
    EXPECT_EQ(m->get_parameter("model.layers.0.self_attn.q_proj.weight").shape(), (Shape{8, 32}));
    EXPECT_EQ(m->get_parameter("lm_head.weight").shape(), (Shape{8, 32}));
    // hidden states are full on every rank, forward's logits full
    Tensor ids = some_ids(2, 8, 32, 1);
    NoGradGuard ng;
    EXPECT_EQ(m->hidden_states(ids).shape(), (Shape{2, 8, 32}));
    EXPECT_EQ(m->forward(ids).shape(), (Shape{2, 8, 32}));
  });
}

TEST(ParallelModels, SizesThatDoNotSplitRaiseNamingTheValues) {
  ModelConfig c = llama(2);
  c.hidden_size = 48;
  c.num_attention_heads = 6;
  c.num_kv_heads = 6;
  std::string e = error_of(c, 4);
  EXPECT_NE(e.find("num_attention_heads=6 is not divisible by tensor parallel size 4"),
            std::string::npos)
      << e;
  c = llama(2);  // 2 kv heads, multiplier 1, TP 4
  e = error_of(c, 4);
  EXPECT_NE(e.find("num_kv_heads=2 x kv_size_multiplier=1 is not divisible by tensor parallel "
                   "size 4 (set kv_size_multiplier=2)"),
            std::string::npos)
      << e;
  c.kv_size_multiplier = 2;  // at TP 2 the two kv heads split without replication
  e = error_of(c, 2);
  EXPECT_NE(e.find("kv_size_multiplier=2 with num_kv_heads=2 at tensor parallel size 2"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("= 1"), std::string::npos) << e;
  c = llama(2);
  c.kv_size_multiplier = 3;
  e = error_of(c, 4);
  EXPECT_NE(e.find("tensor parallel size 4 is not divisible by kv_size_multiplier=3"),
            std::string::npos)
      << e;
  c = neox();
  c.vocab_size = 30;
  e = error_of(c, 4);
  EXPECT_NE(e.find("vocab_size=30 is not divisible by tensor parallel size 4"), std::string::npos)
      << e;
  c = neox();
  c.ffn_hidden_size = 66;
  e = error_of(c, 4);
  EXPECT_NE(e.find("ffn_hidden_size=66 is not divisible by tensor parallel size 4"),
            std::string::npos)
      << e;
  c = llama(2);
  c.kv_size_multiplier = 0;
  EXPECT_THROW(c.validate(), ConfigError);
}

TEST(ParallelModels, MetaModelsGiveShapesOnly) {
  // The memory planner runs models on meta tensors: every TP degree, SP, padding included.
  for (int tp : {1, 2, 4}) {
    for (std::string arch : {"llama", "gpt_neox"}) {
      run_ranks(tp, [&] {
        parallel_state::initialize_model_parallel(tp);
        ModelConfig c = arch == "llama" ? llama(2) : neox();
        c.kv_size_multiplier = arch == "llama" ? std::max(1, tp / 2) : 1;
        c.sequence_parallel = true;
        c.device = Device::meta;
        auto m = make_causal_lm(c, 1);
        Tensor ids = empty({2, 6}, DType::i64, Device::meta);
        Tensor loss = m->loss(ids, ids);
        EXPECT_TRUE(loss.is_meta()) << arch << " tp=" << tp;
        backward(loss);
        for (auto& [name, t] : m->named_parameters()) {
          ASSERT_TRUE(t.grad().defined()) << name;
          EXPECT_TRUE(t.grad().is_meta()) << name;
          EXPECT_EQ(t.grad().shape(), t.shape()) << name;
        }
      });
    }
  }
}

TEST(ParallelModels, DropoutMatchesSingleRank) {
  // Without SP the activations outside the TP regions are duplicated and every rank draws the
  // single rank's masks (same Context seed, same draws in the same order); with SP each rank
  // applies its slice of the single rank's mask.
  for (std::string arch : {"llama", "gpt_neox"}) {
    for (bool sp : {false, true}) {
      Case c;
      c.cfg = tp4_config(arch);
      c.cfg.dropout = 0.2;
      c.cfg.sequence_parallel = sp;
      c.tp = 4;
      c.what = arch + " tp=4 dropout 0.2" + (sp ? " sp" : "");
      check_case(c);
    }
  }
}

TEST(ParallelModels, Bf16ShardsAreTheSingleRankWeightsAndTheLossAgrees) {
  // bf16 parameters: every shard is bitwise the slice of the single-rank bf16 weight; the loss
  // agrees within bf16 accuracy (reductions run in f32, activations round differently).
  for (std::string arch : {"llama", "gpt_neox"}) {
    Case c;
    c.cfg = tp4_config(arch);
    c.cfg.sequence_parallel = true;
    c.cfg.dtype = DType::bf16;
    const Result ref = reference(c);
    run_ranks(4, [&] {
      parallel_state::initialize_model_parallel(4);
      Communicator& g = parallel_state::get_tensor_model_parallel_group();
      auto m = make_causal_lm(c.cfg, 17);
      Result r = run_model(*m, c);
      EXPECT_EQ(r.loss.dtype(), DType::f32);  // bf16 logits, f32 loss
      EXPECT_TRUE(nxd::testing::close_rel(r.loss, ref.loss, 2e-2, arch + " bf16 loss"));
      for (const auto& pp : parallel_parameters(*m))
        EXPECT_TRUE(nxd::testing::bitwise_equal(gather_full(g, pp.tensor, pp.attrs, pp.name),
                                                ref.weights.at(pp.name), pp.name));
    });
  }
}

TEST(ParallelModels, AttentionLayerChecksHeadsAgainstTheTPDegree) {
  auto message = [](int tp, const AttentionOptions& o) {
    std::string msg;
    try {
      run_ranks(tp, [&] {
        parallel_state::initialize_model_parallel(tp);
        CausalSelfAttention a(o);
      });
    } catch (const ShapeError& e) {
      msg = e.what();
    }
    return msg;
  };
  AttentionOptions f;  // fused: 3*2*12 = 72 rows divide by 4, but 2 heads do not
  f.hidden_size = 24;
  f.num_heads = 2;
  f.layout = QkvLayout::fused_neox;
  f.bias = true;
  std::string e = message(4, f);
  EXPECT_NE(e.find("[CausalSelfAttention] 2 attention heads are not divisible by tensor parallel "
                   "size 4"),
            std::string::npos)
      << e;
  AttentionOptions g;  // 2 kv heads replicated twice over 2 ranks: misaligned
  g.hidden_size = 16;
  g.num_heads = 4;
  g.num_kv_heads = 2;
  g.kv_size_multiplier = 2;
  e = message(2, g);
  EXPECT_NE(e.find("[CausalSelfAttention] kv_size_multiplier=2 with 2 key/value heads at tensor "
                   "parallel size 2"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("= 1"), std::string::npos) << e;
}
