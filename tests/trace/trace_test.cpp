// Traced equals eager (bitwise: the replay calls the same ops), at TP 1, 2 and 4 on sim ranks and
// at TP 2 under mpirun -np 2; buckets route, pad and refuse; host reads while tracing are refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "nxd/autograd/ops.h"
#include "support/compare.h"
#include "support/files.h"
#include "trace_util.h"

using namespace nxd;
using namespace nxd::testing;

namespace {

// The eager logits of rank 0 and the traced ones, from the same ranks.
void check_traced_equals_eager(const std::string& arch, int tp) {
  const ModelConfig cfg = trace_config(arch, tp);
  const Tensor ids = trace_ids(2, 8, cfg.vocab_size);
  if (under_mpi()) {
    run_ranks(tp, [&] {
      parallel_state::initialize_model_parallel(tp);
      Tensor eager;
      {
        NoGradGuard ng;
        auto m = make_causal_lm(cfg, 7);
        m->eval();
        eager = m->forward(ids);
      }
      trace::TraceOptions o{.tp_degree = tp, .backend = "mpi"};
      auto tm = trace::parallel_model_trace(causal_lm_fn(cfg), {ids}, o);
      EXPECT_BITWISE_EQ(tm->forward({ids})[0], eager);
      o.args = "--fuse";
      auto fused = trace::parallel_model_trace(causal_lm_fn(cfg), {ids}, o);
      EXPECT_ALLCLOSE(fused->forward({ids})[0], eager, 1e-6, 1e-6);
    });
    return;
  }
  Tensor eager;
  run_ranks(tp, [&] {
    parallel_state::initialize_model_parallel(tp);
    NoGradGuard ng;
    auto m = make_causal_lm(cfg, 7);
    m->eval();
    Tensor y = m->forward(ids);
    if (current_context().rank() == 0) eager = y;
  });
  // fusion off (the default): the same ops on the same inputs, bitwise
  trace::TraceOptions o{.tp_degree = tp};
  auto tm = trace::parallel_model_trace(causal_lm_fn(cfg), {ids}, o);
  const Tensor traced = tm->forward({ids})[0];
  EXPECT_BITWISE_EQ(traced, eager);
  // fusion on: one rounding less per fused residual add
  auto fused =
      trace::parallel_model_trace(causal_lm_fn(cfg), {ids}, {.tp_degree = tp, .args = "--fuse"});
  EXPECT_ALLCLOSE(fused->forward({ids})[0], eager, 1e-6, 1e-6);
  // at TP 1 both residual adds of every layer fuse with the product before them (o_proj and
  // down_proj; GPT-NeoX's dense and dense_4h_to_h, with their biases); at TP > 1 the all-reduce
  // sits between the product and the add
  const int want = tp > 1 ? 0 : 2 * static_cast<int>(cfg.num_layers);
  EXPECT_EQ(fused->ranks()[0].graphs[0]->fused_nodes, want);
  EXPECT_EQ(tm->ranks().size(), static_cast<size_t>(tp));
  // the static plan placed most intermediates in the arena
  const auto& p0 = tm->ranks()[0];
  EXPECT_GT(p0.replay[0].placed, static_cast<int64_t>(p0.graphs[0]->graph.nodes.size() / 4));
}

}  // namespace

TEST(Trace, LlamaTracedEqualsEager) {
  for (int tp : {1, 2, 4}) {
    if (tp > max_ranks()) continue;
    SCOPED_TRACE("tp=" + std::to_string(tp));
    check_traced_equals_eager("llama", tp);
  }
}

TEST(Trace, GptNeoxTracedEqualsEager) {
  for (int tp : {1, 2, 4}) {
    if (tp > max_ranks()) continue;
    SCOPED_TRACE("tp=" + std::to_string(tp));
    check_traced_equals_eager("gpt_neox", tp);
  }
}

TEST(Trace, GraphRecordsKindsAndAliases) {
  const ModelConfig cfg = trace_config("llama", 1);
  auto rm = causal_lm_fn(cfg)();
  const Tensor ids = trace_ids(1, 4, cfg.vocab_size);
  trace::TraceResult r = trace::trace_graph(rm.forward, {rm.params, {ids}, {}});
  const trace::Graph& g = r.graph;
  EXPECT_EQ(g.params.size(), rm.params.size());
  ASSERT_EQ(g.args.size(), 1u);
  EXPECT_EQ(g.values[g.args[0]].shape, (Shape{1, 4}));
  int linears = 0, views = 0;
  for (const auto& n : g.nodes) {
    linears += n.op == "linear";
    if (n.op == "view" || n.op == "transpose") {
      ++views;
      EXPECT_GE(g.values[n.outputs[0]].alias_of, 0) << n.op;
    }
  }
  EXPECT_EQ(linears, 2 * 7 + 1);  // q k v o gate up down per layer, and the head
  EXPECT_GT(views, 0);
  // the JSON form round-trips to the same text
  const std::string j = trace::graph_to_json(g);
  EXPECT_EQ(trace::graph_to_json(trace::graph_from_json(j, "mem")), j);
}

TEST(Trace, HostReadWhileTracingIsRefusedNamingTheOp) {
  const Tensor w = full({4, 4}, 0.5);
  trace::ForwardFn f = [&](const std::vector<Tensor>& a) {
    Tensor y = linear(a[0], w);
    if (sum(y).item() > 0) return std::vector<Tensor>{relu(y)};  // a branch on data
    return std::vector<Tensor>{neg(y)};
  };
  try {
    trace::trace_graph(f, {{{"w", w}}, {ones({2, 4})}, {}});
    FAIL() << "no error";
  } catch (const trace::TraceError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Tensor::item"), std::string::npos) << m;
    EXPECT_NE(m.find("output of 'sum'"), std::string::npos) << m;
  }
  // reading a weight (not data-dependent) is allowed; so is reading after the trace ended
  trace::ForwardFn g = [&](const std::vector<Tensor>& a) {
    const double s = w.at({0, 0});
    return std::vector<Tensor>{mul(a[0], s)};
  };
  auto r = trace::trace_graph(g, {{{"w", w}}, {ones({2, 4})}, {}});
  EXPECT_EQ(r.outputs[0].at({0, 0}), 0.5);
}

TEST(Trace, DeadCodeIsRemovedAndPlanReusesMemory) {
  trace::ForwardFn f = [](const std::vector<Tensor>& a) {
    Tensor unused = exp(a[0]);  // dead
    Tensor h = relu(a[0]);
    Tensor h2 = tanh(h);
    Tensor h3 = sigmoid(h2);
    Tensor h4 = neg(h3);
    return std::vector<Tensor>{add(h4, a[0])};
  };
  const Tensor x = from_doubles({-1, 2, -3, 4, 5, -6}, {2, 3});
  auto r = trace::trace_graph(f, {{}, {x}, {}});
  trace::CompiledGraph c = trace::compile(r.graph, {});
  EXPECT_EQ(c.removed_nodes, 1);
  // h, h2, h3, h4 are 64-byte slots alive two at a time: 128 bytes, not 256
  EXPECT_EQ(c.plan.intermediate_bytes, 4 * 64);
  EXPECT_EQ(c.plan.arena_bytes, 2 * 64);
  trace::ReplayState st;
  std::vector<Tensor> args{x}, none;
  auto y = trace::run(c, {&none, &args, &none, &none}, st);
  EXPECT_BITWISE_EQ(y[0], r.outputs[0]);
  trace::CompiledGraph o0 = trace::compile(r.graph, trace::parse_compiler_args("-O0"));
  EXPECT_EQ(o0.removed_nodes, 0);
  EXPECT_EQ(o0.plan.arena_bytes, 0);
  EXPECT_FALSE(trace::parse_compiler_args("").fuse);
  EXPECT_TRUE(trace::parse_compiler_args("-O2").fuse);
  EXPECT_FALSE(trace::parse_compiler_args("-O2 --no-fuse").fuse);
  EXPECT_THROW(trace::parse_compiler_args("--fast"), trace::TraceError);
}

TEST(Trace, IdenticalRankGraphsCompileOnceAndWorkdirHasDumps) {
  if (under_mpi()) GTEST_SKIP() << "sim only";
  const ModelConfig cfg = trace_config("gpt_neox", 2);
  const auto dir = test_temp_dir("nxd_trace_");
  trace::TraceOptions o{.tp_degree = 2, .workdir = dir.string()};
  auto tm = trace::parallel_model_trace(causal_lm_fn(cfg), {trace_ids(1, 8, cfg.vocab_size)}, o);
  // the two ranks differ only in the vocabulary-parallel lookup's start: two graphs
  EXPECT_EQ(tm->distinct_compilations(), 2);
  const std::string text = slurp(dir / "rank1" / "bucket0.txt");
  EXPECT_NE(text.find("tp_all_reduce"), std::string::npos);
  EXPECT_NE(text.find("# arena "), std::string::npos);
}
