// Partitioning from the model's own pieces (pipeline/pieces.h, partition.h): the built-in
// families' counts and auto_partition are those of the former formula, a user's CausalLM names
// its layers and tied weights, the modeled-cost balance is a contiguous min-max split of
// measured forward + backward times, and impossible inputs are ConfigErrors naming the numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "nxd/collectives/parallel_state.h"
#include "nxd/pipeline/partition.h"
#include "nxd/runtime/sim/clock.h"
#include "support/ranks.h"
#include "support/tiny_models.h"
#include "toy_lm.h"

using namespace nxd;
using namespace nxd::pipeline;
using nxd::testing::run_ranks;

namespace {

ModelConfig tiny(const std::string& arch, int64_t layers, int64_t vocab, bool tied = false) {
  ModelConfig c = nxd::testing::micro_model(arch);
  c.vocab_size = vocab;
  c.num_layers = layers;
  c.init_std = ModelConfig{}.init_std;
  c.tie_word_embeddings = tied;
  return c;
}

std::string ends_of(const std::vector<ModelPart>& parts) {
  std::string s;
  for (const ModelPart& p : parts) {
    if (!s.empty()) s += ' ';
    s += std::to_string(p.layer_end);
  }
  return s;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

// The smallest largest-stage total over every contiguous split (exhaustive), for checking
// auto_partition's optimum.
double best_split(const ModelPieces& p, int stages, const std::function<double(PieceSize)>& w) {
  const int64_t L = p.num_layers();
  double best = 1e300;
  std::function<void(int, int64_t, double)> go = [&](int s, int64_t begin, double worst) {
    const int64_t last = s == stages - 1 ? L : L - (stages - 1 - s);
    for (int64_t end = s == stages - 1 ? L : begin + 1; end <= last; ++end) {
      ModelPart part;
      part.layer_begin = begin;
      part.layer_end = end;
      part.embedding = s == 0;
      part.head = s == stages - 1;
      const double v = std::max(worst, w(p.part_size(part)));
      if (s == stages - 1)
        best = std::min(best, v);
      else
        go(s + 1, end, v);
    }
  };
  go(0, 0, 0);
  return best;
}

// Parts cover layers [0, L) once, in order, each with >= 1 layer; embedding first, head last.
void expect_contiguous(const std::vector<ModelPart>& parts, int64_t L, int stages) {
  ASSERT_EQ(static_cast<int>(parts.size()), stages);
  int64_t next = 0;
  for (size_t s = 0; s < parts.size(); ++s) {
    EXPECT_EQ(parts[s].layer_begin, next) << "stage " << s;
    EXPECT_GT(parts[s].layer_end, parts[s].layer_begin) << "stage " << s;
    EXPECT_EQ(parts[s].embedding, s == 0) << "stage " << s;
    EXPECT_EQ(parts[s].head, s + 1 == parts.size()) << "stage " << s;
    next = parts[s].layer_end;
  }
  EXPECT_EQ(next, L);
}

double seconds(const PieceSize& p) {
  return p.seconds;
}

// auto_partition's modeled-cost split, and the part's seconds printed per stage.
std::vector<ModelPart> cost_split(const ModelPieces& p, int stages, const std::string& what) {
  std::vector<ModelPart> parts = auto_partition(p, stages, PartitionBalance::modeled_cost);
  std::printf("    [%s] modeled cost per stage:", what.c_str());
  for (const ModelPart& part : parts)
    std::printf(" [%lld, %lld) %.3g us", static_cast<long long>(part.layer_begin),
                static_cast<long long>(part.layer_end), p.part_size(part).seconds * 1e6);
  std::printf("\n");
  return parts;
}

struct Former {
  int tp;
  const char* arch;
  int tied;
  int64_t vocab, layers;
  int stages;
  const char* ends;                // auto_partition's stage ends
  int64_t layer, embedding, head;  // count_parameters: a layer, embedding, head w/o tied copy
};

// What count_parameters (the whole model built on meta, its names sorted by family) and
// auto_partition gave before the pieces were measured on the model itself. TP 2 llama has one
// KV head replicated twice.
const Former kFormer[] = {
    {1, "llama", 0, 4, 5, 2, "3 5", 2208, 64, 80},
    {1, "llama", 0, 4, 5, 3, "2 4 5", 2208, 64, 80},
    {1, "llama", 0, 4, 5, 4, "1 2 4 5", 2208, 64, 80},
    {1, "llama", 0, 4, 8, 2, "4 8", 2208, 64, 80},
    {1, "llama", 0, 4, 8, 3, "3 6 8", 2208, 64, 80},
    {1, "llama", 0, 4, 8, 4, "2 4 6 8", 2208, 64, 80},
    {1, "llama", 0, 512, 5, 2, "3 5", 2208, 8192, 8208},
    {1, "llama", 0, 512, 5, 3, "1 4 5", 2208, 8192, 8208},
    {1, "llama", 0, 512, 5, 4, "1 2 4 5", 2208, 8192, 8208},
    {1, "llama", 0, 512, 8, 2, "4 8", 2208, 8192, 8208},
    {1, "llama", 0, 512, 8, 3, "2 7 8", 2208, 8192, 8208},
    {1, "llama", 0, 512, 8, 4, "1 3 7 8", 2208, 8192, 8208},
    {1, "llama", 0, 2048, 5, 2, "3 5", 2208, 32768, 32784},
    {1, "llama", 0, 2048, 5, 3, "1 4 5", 2208, 32768, 32784},
    {1, "llama", 0, 2048, 5, 4, "1 2 4 5", 2208, 32768, 32784},
    {1, "llama", 0, 2048, 8, 2, "4 8", 2208, 32768, 32784},
    {1, "llama", 0, 2048, 8, 3, "1 7 8", 2208, 32768, 32784},
    {1, "llama", 0, 2048, 8, 4, "1 2 7 8", 2208, 32768, 32784},
    {1, "llama", 1, 4, 5, 2, "3 5", 2208, 64, 16},
    {1, "llama", 1, 4, 5, 3, "2 4 5", 2208, 64, 16},
    {1, "llama", 1, 4, 5, 4, "1 2 4 5", 2208, 64, 16},
    {1, "llama", 1, 4, 8, 2, "4 8", 2208, 64, 16},
    {1, "llama", 1, 4, 8, 3, "3 6 8", 2208, 64, 16},
    {1, "llama", 1, 4, 8, 4, "2 4 6 8", 2208, 64, 16},
    {1, "llama", 1, 512, 5, 2, "3 5", 2208, 8192, 16},
    {1, "llama", 1, 512, 5, 3, "1 4 5", 2208, 8192, 16},
    {1, "llama", 1, 512, 5, 4, "1 2 4 5", 2208, 8192, 16},
    {1, "llama", 1, 512, 8, 2, "4 8", 2208, 8192, 16},
    {1, "llama", 1, 512, 8, 3, "2 7 8", 2208, 8192, 16},
    {1, "llama", 1, 512, 8, 4, "1 3 7 8", 2208, 8192, 16},
    {1, "llama", 1, 2048, 5, 2, "3 5", 2208, 32768, 16},
    {1, "llama", 1, 2048, 5, 3, "1 4 5", 2208, 32768, 16},
    {1, "llama", 1, 2048, 5, 4, "1 2 4 5", 2208, 32768, 16},
    {1, "llama", 1, 2048, 8, 2, "4 8", 2208, 32768, 16},
    {1, "llama", 1, 2048, 8, 3, "1 7 8", 2208, 32768, 16},
    {1, "llama", 1, 2048, 8, 4, "1 2 7 8", 2208, 32768, 16},
    {1, "gpt_neox", 0, 4, 5, 2, "3 5", 1960, 64, 96},
    {1, "gpt_neox", 0, 4, 5, 3, "2 4 5", 1960, 64, 96},
    {1, "gpt_neox", 0, 4, 5, 4, "1 2 4 5", 1960, 64, 96},
    {1, "gpt_neox", 0, 4, 8, 2, "4 8", 1960, 64, 96},
    {1, "gpt_neox", 0, 4, 8, 3, "3 6 8", 1960, 64, 96},
    {1, "gpt_neox", 0, 4, 8, 4, "2 4 6 8", 1960, 64, 96},
    {1, "gpt_neox", 0, 512, 5, 2, "3 5", 1960, 8192, 8224},
    {1, "gpt_neox", 0, 512, 5, 3, "1 4 5", 1960, 8192, 8224},
    {1, "gpt_neox", 0, 512, 5, 4, "1 2 4 5", 1960, 8192, 8224},
    {1, "gpt_neox", 0, 512, 8, 2, "4 8", 1960, 8192, 8224},
    {1, "gpt_neox", 0, 512, 8, 3, "1 7 8", 1960, 8192, 8224},
    {1, "gpt_neox", 0, 512, 8, 4, "1 2 7 8", 1960, 8192, 8224},
    {1, "gpt_neox", 0, 2048, 5, 2, "3 5", 1960, 32768, 32800},
    {1, "gpt_neox", 0, 2048, 5, 3, "1 4 5", 1960, 32768, 32800},
    {1, "gpt_neox", 0, 2048, 5, 4, "1 2 4 5", 1960, 32768, 32800},
    {1, "gpt_neox", 0, 2048, 8, 2, "4 8", 1960, 32768, 32800},
    {1, "gpt_neox", 0, 2048, 8, 3, "1 7 8", 1960, 32768, 32800},
    {1, "gpt_neox", 0, 2048, 8, 4, "1 2 7 8", 1960, 32768, 32800},
    {1, "gpt_neox", 1, 4, 5, 2, "3 5", 1960, 64, 32},
    {1, "gpt_neox", 1, 4, 5, 3, "2 4 5", 1960, 64, 32},
    {1, "gpt_neox", 1, 4, 5, 4, "1 2 4 5", 1960, 64, 32},
    {1, "gpt_neox", 1, 4, 8, 2, "4 8", 1960, 64, 32},
    {1, "gpt_neox", 1, 4, 8, 3, "3 6 8", 1960, 64, 32},
    {1, "gpt_neox", 1, 4, 8, 4, "2 4 6 8", 1960, 64, 32},
    {1, "gpt_neox", 1, 512, 5, 2, "3 5", 1960, 8192, 32},
    {1, "gpt_neox", 1, 512, 5, 3, "1 4 5", 1960, 8192, 32},
    {1, "gpt_neox", 1, 512, 5, 4, "1 2 4 5", 1960, 8192, 32},
    {1, "gpt_neox", 1, 512, 8, 2, "4 8", 1960, 8192, 32},
    {1, "gpt_neox", 1, 512, 8, 3, "1 7 8", 1960, 8192, 32},
    {1, "gpt_neox", 1, 512, 8, 4, "1 2 7 8", 1960, 8192, 32},
    {1, "gpt_neox", 1, 2048, 5, 2, "3 5", 1960, 32768, 32},
    {1, "gpt_neox", 1, 2048, 5, 3, "1 4 5", 1960, 32768, 32},
    {1, "gpt_neox", 1, 2048, 5, 4, "1 2 4 5", 1960, 32768, 32},
    {1, "gpt_neox", 1, 2048, 8, 2, "4 8", 1960, 32768, 32},
    {1, "gpt_neox", 1, 2048, 8, 3, "1 7 8", 1960, 32768, 32},
    {1, "gpt_neox", 1, 2048, 8, 4, "1 2 7 8", 1960, 32768, 32},
    {2, "llama", 0, 4, 5, 2, "3 5", 992, 32, 48},
    {2, "llama", 0, 4, 5, 3, "2 4 5", 992, 32, 48},
    {2, "llama", 0, 4, 5, 4, "1 2 4 5", 992, 32, 48},
    {2, "llama", 0, 4, 8, 2, "4 8", 992, 32, 48},
    {2, "llama", 0, 4, 8, 3, "3 6 8", 992, 32, 48},
    {2, "llama", 0, 4, 8, 4, "2 4 6 8", 992, 32, 48},
    {2, "llama", 0, 512, 5, 2, "3 5", 992, 4096, 4112},
    {2, "llama", 0, 512, 5, 3, "1 4 5", 992, 4096, 4112},
    {2, "llama", 0, 512, 5, 4, "1 2 4 5", 992, 4096, 4112},
    {2, "llama", 0, 512, 8, 2, "4 8", 992, 4096, 4112},
    {2, "llama", 0, 512, 8, 3, "1 7 8", 992, 4096, 4112},
    {2, "llama", 0, 512, 8, 4, "1 2 7 8", 992, 4096, 4112},
    {2, "llama", 0, 2048, 5, 2, "3 5", 992, 16384, 16400},
    {2, "llama", 0, 2048, 5, 3, "1 4 5", 992, 16384, 16400},
    {2, "llama", 0, 2048, 5, 4, "1 2 4 5", 992, 16384, 16400},
    {2, "llama", 0, 2048, 8, 2, "4 8", 992, 16384, 16400},
    {2, "llama", 0, 2048, 8, 3, "1 7 8", 992, 16384, 16400},
    {2, "llama", 0, 2048, 8, 4, "1 2 7 8", 992, 16384, 16400},
    {2, "llama", 1, 4, 5, 2, "3 5", 992, 32, 16},
    {2, "llama", 1, 4, 5, 3, "2 4 5", 992, 32, 16},
    {2, "llama", 1, 4, 5, 4, "1 2 4 5", 992, 32, 16},
    {2, "llama", 1, 4, 8, 2, "4 8", 992, 32, 16},
    {2, "llama", 1, 4, 8, 3, "3 6 8", 992, 32, 16},
    {2, "llama", 1, 4, 8, 4, "2 4 6 8", 992, 32, 16},
    {2, "llama", 1, 512, 5, 2, "3 5", 992, 4096, 16},
    {2, "llama", 1, 512, 5, 3, "1 4 5", 992, 4096, 16},
    {2, "llama", 1, 512, 5, 4, "1 2 4 5", 992, 4096, 16},
    {2, "llama", 1, 512, 8, 2, "4 8", 992, 4096, 16},
    {2, "llama", 1, 512, 8, 3, "1 7 8", 992, 4096, 16},
    {2, "llama", 1, 512, 8, 4, "1 2 7 8", 992, 4096, 16},
    {2, "llama", 1, 2048, 5, 2, "3 5", 992, 16384, 16},
    {2, "llama", 1, 2048, 5, 3, "1 4 5", 992, 16384, 16},
    {2, "llama", 1, 2048, 5, 4, "1 2 4 5", 992, 16384, 16},
    {2, "llama", 1, 2048, 8, 2, "4 8", 992, 16384, 16},
    {2, "llama", 1, 2048, 8, 3, "1 7 8", 992, 16384, 16},
    {2, "llama", 1, 2048, 8, 4, "1 2 7 8", 992, 16384, 16},
    {2, "gpt_neox", 0, 4, 5, 2, "3 5", 1028, 32, 64},
    {2, "gpt_neox", 0, 4, 5, 3, "2 4 5", 1028, 32, 64},
    {2, "gpt_neox", 0, 4, 5, 4, "1 2 4 5", 1028, 32, 64},
    {2, "gpt_neox", 0, 4, 8, 2, "4 8", 1028, 32, 64},
    {2, "gpt_neox", 0, 4, 8, 3, "3 6 8", 1028, 32, 64},
    {2, "gpt_neox", 0, 4, 8, 4, "2 4 6 8", 1028, 32, 64},
    {2, "gpt_neox", 0, 512, 5, 2, "3 5", 1028, 4096, 4128},
    {2, "gpt_neox", 0, 512, 5, 3, "1 4 5", 1028, 4096, 4128},
    {2, "gpt_neox", 0, 512, 5, 4, "1 2 4 5", 1028, 4096, 4128},
    {2, "gpt_neox", 0, 512, 8, 2, "4 8", 1028, 4096, 4128},
    {2, "gpt_neox", 0, 512, 8, 3, "2 7 8", 1028, 4096, 4128},
    {2, "gpt_neox", 0, 512, 8, 4, "1 3 7 8", 1028, 4096, 4128},
    {2, "gpt_neox", 0, 2048, 5, 2, "3 5", 1028, 16384, 16416},
    {2, "gpt_neox", 0, 2048, 5, 3, "1 4 5", 1028, 16384, 16416},
    {2, "gpt_neox", 0, 2048, 5, 4, "1 2 4 5", 1028, 16384, 16416},
    {2, "gpt_neox", 0, 2048, 8, 2, "4 8", 1028, 16384, 16416},
    {2, "gpt_neox", 0, 2048, 8, 3, "1 7 8", 1028, 16384, 16416},
    {2, "gpt_neox", 0, 2048, 8, 4, "1 2 7 8", 1028, 16384, 16416},
    {2, "gpt_neox", 1, 4, 5, 2, "3 5", 1028, 32, 32},
    {2, "gpt_neox", 1, 4, 5, 3, "2 4 5", 1028, 32, 32},
    {2, "gpt_neox", 1, 4, 5, 4, "1 2 4 5", 1028, 32, 32},
    {2, "gpt_neox", 1, 4, 8, 2, "4 8", 1028, 32, 32},
    {2, "gpt_neox", 1, 4, 8, 3, "3 6 8", 1028, 32, 32},
    {2, "gpt_neox", 1, 4, 8, 4, "2 4 6 8", 1028, 32, 32},
    {2, "gpt_neox", 1, 512, 5, 2, "3 5", 1028, 4096, 32},
    {2, "gpt_neox", 1, 512, 5, 3, "1 4 5", 1028, 4096, 32},
    {2, "gpt_neox", 1, 512, 5, 4, "1 2 4 5", 1028, 4096, 32},
    {2, "gpt_neox", 1, 512, 8, 2, "4 8", 1028, 4096, 32},
    {2, "gpt_neox", 1, 512, 8, 3, "2 7 8", 1028, 4096, 32},
    {2, "gpt_neox", 1, 512, 8, 4, "1 3 7 8", 1028, 4096, 32},
    {2, "gpt_neox", 1, 2048, 5, 2, "3 5", 1028, 16384, 32},
    {2, "gpt_neox", 1, 2048, 5, 3, "1 4 5", 1028, 16384, 32},
    {2, "gpt_neox", 1, 2048, 5, 4, "1 2 4 5", 1028, 16384, 32},
    {2, "gpt_neox", 1, 2048, 8, 2, "4 8", 1028, 16384, 32},
    {2, "gpt_neox", 1, 2048, 8, 3, "1 7 8", 1028, 16384, 32},
    {2, "gpt_neox", 1, 2048, 8, 4, "1 2 7 8", 1028, 16384, 32},
};

}  // namespace

TEST(Partition, BuiltInFamiliesMeasureAndSplitAsTheFormerFormula) {
  int checked = 0;
  for (const Former& f : kFormer) {
    const std::string what =
        std::string(f.arch) + " tp=" + std::to_string(f.tp) + " tied=" + std::to_string(f.tied) +
        " vocab=" + std::to_string(f.vocab) + " layers=" + std::to_string(f.layers) +
        " stages=" + std::to_string(f.stages);
    SCOPED_TRACE(what);
    run_ranks(f.tp, [&] {
      if (f.tp > 1) parallel_state::initialize_model_parallel(f.tp, 1);
      ModelConfig c = tiny(f.arch, f.layers, f.vocab, f.tied);
      if (f.tp > 1 && c.arch == "llama") c.num_kv_heads = 1, c.kv_size_multiplier = f.tp;
      const ModelPieces p = measure_pieces(c);
      EXPECT_EQ(ends_of(auto_partition(p, f.stages)), f.ends);
      for (const PieceSize& l : p.layers) EXPECT_EQ(l.parameters, f.layer);
      EXPECT_EQ(p.embedding.parameters, f.embedding);
      EXPECT_EQ(p.head.parameters, f.head + (f.tied ? f.embedding : 0));
      EXPECT_EQ(p.head.bytes, 4 * p.head.parameters);
      EXPECT_EQ(p.tied_size.parameters, f.tied ? f.embedding : 0);
    });
    ++checked;
  }
  EXPECT_EQ(checked, 144);
}

TEST(Partition, LayerNamesAndTiedWeightsComeFromTheModel) {
  struct Case {
    ModelConfig cfg;
    PartBuilder build;
    std::string prefix, tied;
  };
  const std::vector<Case> cases = {
      {tiny("llama", 4, 32, true), {}, "model.layers.", "model.embed_tokens.weight"},
      {tiny("gpt_neox", 4, 32, true), {}, "gpt_neox.layers.", "gpt_neox.embed_in.weight"},
      {[] {
         ModelConfig c = nxd::testing::toy_config();
         c.tie_word_embeddings = true;
         return c;
       }(),
       nxd::testing::build_toy, "blocks.", "tok.weight"},
  };
  for (const Case& k : cases) {
    PieceOptions o;
    o.build = k.build;
    const ModelPieces p = measure_pieces(k.cfg, o);
    EXPECT_EQ(p.layer_prefix, k.prefix);
    EXPECT_EQ(p.tied, std::vector<std::string>{k.tied});
    const std::string cut = k.prefix + "1";
    EXPECT_EQ(ends_of(partition_by_cuts(p, {cut}, 2)), "2 4") << cut;
    ModelConfig untied = k.cfg;
    untied.tie_word_embeddings = false;
    EXPECT_TRUE(measure_pieces(untied, o).tied.empty()) << k.prefix;
  }
  // a built-in family's name is not a layer of the user's model
  PieceOptions toy;
  toy.build = nxd::testing::build_toy;
  const ModelPieces p = measure_pieces(nxd::testing::toy_config(), toy);
  EXPECT_NE(error_of([&] {
              partition_by_cuts(p, {"model.layers.1"}, 2);
            }).find("'model.layers.1' is not a decoder layer (blocks.0 .. blocks.3)"),
            std::string::npos);
}

TEST(Partition, AUserModelsUnequalLayersAreMeasuredOnTheModel) {
  PieceOptions o;
  o.build = nxd::testing::build_toy;
  const ModelPieces p = measure_pieces(nxd::testing::toy_config(), o);
  for (int64_t l = 0; l < 4; ++l) {  // ln (2 x 16) + MLP 16 -> w -> 16 with biases
    const int64_t w = 8 * (l + 1);
    EXPECT_EQ(p.layers[l].parameters, 2 * 16 + 16 * w + w + w * 16 + 16) << "layer " << l;
  }
  EXPECT_EQ(p.embedding.parameters, 32 * 16);
  EXPECT_EQ(p.head.parameters, 2 * 16 + 32 * 16);  // ln_f + lm_head
  for (int stages : {2, 3}) {
    const auto parts = auto_partition(p, stages);
    expect_contiguous(parts, 4, stages);
    double worst = 0;
    for (const ModelPart& part : parts)
      worst = std::max(worst, static_cast<double>(p.part_size(part).parameters));
    EXPECT_EQ(worst, best_split(p, stages, [](PieceSize s) { return s.parameters; }));
  }
  EXPECT_EQ(ends_of(auto_partition(p, 2)), "3 4");  // the widest layer goes alone with the head
  EXPECT_GT(p.layers[3].seconds, p.layers[0].seconds);
}

TEST(Partition, ModeledCostSplitsContiguouslyAtTheOptimum) {
  for (const std::string arch : {"llama", "gpt_neox"})
    for (int64_t vocab : {4, 2048})
      for (int stages : {2, 3, 4, 8}) {
        const ModelConfig c = tiny(arch, 8, vocab);
        const ModelPieces p = measure_pieces(c);
        const std::string what =
            arch + " vocab=" + std::to_string(vocab) + " stages=" + std::to_string(stages);
        const auto parts = auto_partition(p, stages, PartitionBalance::modeled_cost);
        expect_contiguous(parts, 8, stages);
        double worst = 0;
        for (const ModelPart& part : parts) worst = std::max(worst, p.part_size(part).seconds);
        EXPECT_NEAR(worst, best_split(p, stages, seconds), 1e-15) << what;
      }
}

TEST(Partition, ModeledCostEqualsParametersWhenTheLayersDominate) {
  for (const std::string arch : {"llama", "gpt_neox"})
    for (auto [layers, stages] : {std::pair<int64_t, int>{6, 3}, {8, 4}, {8, 2}}) {
      const ModelPieces p = measure_pieces(tiny(arch, layers, 4));
      for (size_t l = 1; l < p.layers.size(); ++l)
        EXPECT_EQ(p.layers[l].seconds, p.layers[0].seconds);  // equal layers, equal cost
      const auto by_cost = auto_partition(p, stages, PartitionBalance::modeled_cost);
      EXPECT_EQ(ends_of(by_cost), ends_of(auto_partition(p, stages))) << arch;
      for (const ModelPart& part : by_cost)
        EXPECT_EQ(part.layer_end - part.layer_begin, layers / stages);
    }
}

TEST(Partition, ModeledCostMovesLayersOffAnExpensiveHead) {
  // small vocabulary: an even split; a large one makes the head the costliest piece
  const auto even = cost_split(measure_pieces(tiny("llama", 8, 4)), 2, "vocab 4");
  EXPECT_EQ(ends_of(even), "4 8");
  const auto large = cost_split(measure_pieces(tiny("llama", 8, 8192)), 2, "vocab 8192");
  EXPECT_LT(large[1].layer_end - large[1].layer_begin, 4) << ends_of(large);
  // tied: the embedding's parameters weigh the same on both ends, but a lookup costs far less
  // than the head's matmul and cross entropy, so the cost puts more layers on stage 0
  const ModelPieces tied = measure_pieces(tiny("llama", 8, 2048, true));
  EXPECT_LT(tied.embedding.seconds * 10, tied.head.seconds);
  EXPECT_EQ(ends_of(auto_partition(tied, 2)), "4 8");
  EXPECT_GT(cost_split(tied, 2, "tied vocab 2048")[0].layer_end, 4);
  // a longer microbatch costs more, in proportion
  PieceOptions longer;
  longer.micro_batch_size = 4;
  const ModelPieces four = measure_pieces(tiny("llama", 8, 4), longer);
  EXPECT_GT(four.layers[0].seconds, measure_pieces(tiny("llama", 8, 4)).layers[0].seconds);
}

TEST(Partition, MeasuringLeavesTheRanksClockRngAndMemoryAlone) {
  run_ranks(2, [] {
    parallel_state::initialize_model_parallel(2, 1);
    Context& ctx = current_context();
    sim::SimClock* clock = sim::current_sim_clock();
    const double now = clock ? clock->now() : 0;
    const uint64_t counter = ctx.rng().counter();
    const int64_t live = ctx.memory().live();
    ModelConfig c = tiny("llama", 4, 32);
    c.dropout = 0.1;  // draws masks in training mode: from the scratch context's stream
    const ModelPieces p = measure_pieces(c);
    EXPECT_GT(p.layers[0].seconds, 0);
    EXPECT_NE(p.cost_model.find("trn1.32xlarge"), std::string::npos) << p.cost_model;
    EXPECT_EQ(ctx.rng().counter(), counter);
    EXPECT_EQ(ctx.memory().live(), live);
    if (clock) {
      EXPECT_EQ(clock->now(), now);
    }
  });
}

TEST(Partition, ImpossibleInputsAreConfigErrorsNamingTheNumbers) {
  const ModelConfig c = tiny("llama", 4, 32);
  const ModelPieces p = measure_pieces(c);
  auto has = [](const std::string& msg, const std::string& want) {
    EXPECT_NE(msg.find(want), std::string::npos) << "'" << msg << "' lacks '" << want << "'";
  };
  for (PartitionBalance b : {PartitionBalance::parameters, PartitionBalance::modeled_cost}) {
    has(error_of([&] { auto_partition(p, 5, b); }), "num_layers=4 cannot be split into 5 stages");
    has(error_of([&] { auto_partition(p, 0, b); }), "pipeline: 0 stages");
  }
  has(error_of([&] { auto_partition(c, 6, PartitionBalance::modeled_cost); }),
      "num_layers=4 cannot be split into 6 stages");
  PieceOptions o;
  o.micro_batch_size = 0;
  has(error_of([&] { measure_pieces(c, o); }), "micro_batch_size=0");
  o.micro_batch_size = 1;
  o.seq_length = 17;
  has(error_of([&] { measure_pieces(c, o); }),
      "seq_length=17 is not in [0, max_position_embeddings=16]");
  has(error_of([] { parse_partition_balance("cost"); }),
      "'cost' is not one of parameters, modeled_cost");
  EXPECT_EQ(parse_partition_balance("modeled_cost"), PartitionBalance::modeled_cost);
  EXPECT_STREQ(partition_balance_name(PartitionBalance::parameters), "parameters");
}

TEST(Partition, ABuilderThatIgnoresThePartIsAConfigError) {
  PieceOptions o;
  o.build = [](const ModelConfig& c, uint64_t seed, const ModelPart&) {
    return nxd::testing::build_toy(c, seed, ModelPart{});  // always the whole model
  };
  const std::string msg = error_of([&] { measure_pieces(nxd::testing::toy_config(), o); });
  EXPECT_NE(msg.find("asked for layers [0, 1), the part builder built ToyLM of embedding + "
                     "layers [0, 4) + head"),
            std::string::npos)
      << msg;
  o.build = [](const ModelConfig& c, uint64_t seed, const ModelPart& part) {
    return std::make_shared<nxd::testing::ToyLM>(c, part, /*whole_model_names=*/false);
  };
  const std::string names = error_of([&] { measure_pieces(nxd::testing::toy_config(), o); });
  EXPECT_NE(names.find("decoder layer 1's part holds 'blocks.0.ln.weight'"), std::string::npos)
      << names;
  o.build = [](const ModelConfig&, uint64_t, const ModelPart&) {
    return std::shared_ptr<CausalLM>();
  };
  EXPECT_NE(error_of([&] {
              measure_pieces(nxd::testing::toy_config(), o);
            }).find("the part builder returned no model for layers [0, 1)"),
            std::string::npos);
}

// A declared transformer layer type (TrainingModule::transformer_layer_type, NxD's
// transformer_layer_cls) is checked against every layer piece: one module of that type, where
// the layer's parameters are.
TEST(Partition, DeclaredLayerTypeIsCheckedOnEveryLayer) {
  for (const auto& [arch, type] : std::vector<std::pair<std::string, std::string>>{
           {"llama", "LlamaDecoderLayer"}, {"gpt_neox", "GPTNeoXLayer"}}) {
    PieceOptions o;
    o.layer_type = type;
    EXPECT_EQ(measure_pieces(tiny(arch, 4, 32), o).num_layers(), 4) << arch;
    o.layer_type = "MyDecoderLayer";
    const std::string e = error_of([&] { measure_pieces(tiny(arch, 4, 32), o); });
    EXPECT_NE(e.find("declares its transformer layers as 'MyDecoderLayer', but decoder layer 0's "
                     "part holds 0 module(s) of that type (it holds: "),
              std::string::npos)
        << e;
    EXPECT_NE(e.find(type), std::string::npos) << e;  // the types it does hold are listed
  }
}
