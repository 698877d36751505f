// nxd-plan: will this model fit, and how fast will it train, on N trn1 nodes? It runs one real
// training step of nxd-train's configuration (the model, parallel layers, pipeline schedule,
// ZeRO-1, precision, activation checkpointing, gradient accumulation) on meta tensors over the
// sim backend with 32 x N ranks (train/plan.h): nothing is allocated for data.
//
//   nxd-plan [--config FILE]... [--set key=value]... [--model PRESET] [--instance TYPE]
//            [--nodes N] [--timeline PATH] [--search]
//
// Exit codes: 0 it fits (or --search found a layout that fits), 3 it does not fit, 2 a user
// mistake (one line on stderr), 1 anything else.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "nxd/runtime/error.h"
#include "nxd/runtime/sim/machine.h"
#include "nxd/train/config.h"
#include "nxd/train/plan.h"

using namespace nxd;
using namespace nxd::trainer;

namespace {

// Published model sizes (Hugging Face config.json of each model: meta-llama/Llama-2-7b-hf,
// -13b-hf, -70b-hf, meta-llama/Llama-3.1-8B, -70B, EleutherAI/gpt-neox-20b). gpt3-175b: GPT-3's
// sizes (Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1: 96 layers,
// d_model 12288, 96 heads, context 2048; d_ff = 4 d_model) on nxd's GPT-NeoX architecture
// (rotary positions and a parallel residual instead of GPT-3's learned positions and sequential
// residual: the same matmul FLOPs), with GPT-2's 50,257-token vocabulary padded to 50,304 (a
// multiple of 128, as Megatron pads it).
struct Preset {
  const char* name;
  std::vector<std::string> keys;
};
const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"llama2-7b",
       {"model.arch=llama", "model.hidden_size=4096", "model.num_layers=32",
        "model.num_attention_heads=32", "model.num_kv_heads=32", "model.ffn_hidden_size=11008",
        "model.vocab_size=32000", "model.max_position_embeddings=4096"}},
      {"llama2-13b",
       {"model.arch=llama", "model.hidden_size=5120", "model.num_layers=40",
        "model.num_attention_heads=40", "model.num_kv_heads=40", "model.ffn_hidden_size=13824",
        "model.vocab_size=32000", "model.max_position_embeddings=4096"}},
      {"llama2-70b",
       {"model.arch=llama", "model.hidden_size=8192", "model.num_layers=80",
        "model.num_attention_heads=64", "model.num_kv_heads=8", "model.ffn_hidden_size=28672",
        "model.vocab_size=32000", "model.max_position_embeddings=4096"}},
      {"llama3.1-8b",
       {"model.arch=llama", "model.hidden_size=4096", "model.num_layers=32",
        "model.num_attention_heads=32", "model.num_kv_heads=8", "model.ffn_hidden_size=14336",
        "model.vocab_size=128256", "model.max_position_embeddings=131072",
        "model.rope_theta=500000"}},
      {"llama3.1-70b",
       {"model.arch=llama", "model.hidden_size=8192", "model.num_layers=80",
        "model.num_attention_heads=64", "model.num_kv_heads=8", "model.ffn_hidden_size=28672",
        "model.vocab_size=128256", "model.max_position_embeddings=131072",
        "model.rope_theta=500000"}},
      {"gpt-neox-20b",
       {"model.arch=gpt_neox", "model.hidden_size=6144", "model.num_layers=44",
        "model.num_attention_heads=64", "model.num_kv_heads=64", "model.ffn_hidden_size=24576",
        "model.vocab_size=50432", "model.max_position_embeddings=2048", "model.rotary_pct=0.25"}},
      {"gpt3-175b",
       {"model.arch=gpt_neox", "model.hidden_size=12288", "model.num_layers=96",
        "model.num_attention_heads=96", "model.num_kv_heads=96", "model.ffn_hidden_size=49152",
        "model.vocab_size=50304", "model.max_position_embeddings=2048"}},
  };
  return p;
}

struct Args {
  std::vector<std::string> configs, sets;
  std::string model, instance = "trn1.32xlarge", timeline;
  int nodes = 1;
  bool search = false;
};

const char* kUsage =
    "usage: nxd-plan [--config FILE]... [--set key=value]... [--model PRESET]\n"
    "                [--instance TYPE] [--nodes N] [--timeline PATH] [--search]\n"
    "  presets: llama2-7b llama2-13b llama2-70b llama3.1-8b llama3.1-70b gpt-neox-20b gpt3-175b\n";

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UserError(str("[nxd-plan] ", s, " needs a value\n", kUsage));
      return argv[++i];
    };
    if (s == "--config")
      a.configs.push_back(value());
    else if (s == "--set")
      a.sets.push_back(value());
    else if (s == "--model")
      a.model = value();
    else if (s == "--instance")
      a.instance = value();
    else if (s == "--nodes") {
      const std::string v = value();
      a.nodes = std::atoi(v.c_str());
      if (a.nodes < 1) throw UserError(str("[nxd-plan] --nodes must be >= 1, got ", v));
    } else if (s == "--timeline")
      a.timeline = value();
    else if (s == "--search")
      a.search = true;
    else if (s == "-h" || s == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else
      throw UserError(str("[nxd-plan] unknown argument '", s, "'\n", kUsage));
  }
  return a;
}

// The configuration: nxd-train's defaults, random data (nothing is read), the preset, the files,
// the overrides, and the world of the nodes.
Config make_config(const Args& a, const sim::MachineSpec& m) {
  Config c;
  c.apply_override("data.kind=random");
  c.apply_override("generation.max_new_tokens=0");
  if (!a.model.empty()) {
    const auto it = std::find_if(presets().begin(), presets().end(),
                                 [&](const Preset& p) { return a.model == p.name; });
    if (it == presets().end())
      throw UserError(str("[nxd-plan] unknown --model '", a.model, "'\n", kUsage));
    for (const auto& k : it->keys) c.apply_override(k);
  }
  for (const auto& f : a.configs) c.merge_file(f);
  for (const auto& s : a.sets) c.apply_override(s);
  c.apply_override(str("backend.world_size=", m.world_size()));
  c.apply_override("backend.instance=" + m.name);
  return c;
}

// Model FLOPs of one token's forward and backward, the useful work MFU counts (Megatron-LM's
// num_floating_point_operations, without recomputation): 6 per weight of the matmuls (the
// vocabulary projection once: the input embedding is a lookup) and the attention products,
// Q K^T and P V, of the causal half of the S x S scores: 3 x 2 x 2 x h x S / 2 = 6 h S per layer.
// The sim device charges at least that (recomputation, the fused kernel's whole diagonal blocks,
// rooflines below peak), so MFU stays at or under 1.
double model_flops_per_token(const TrainConfig& c) {
  const auto& m = c.model;
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn_hidden_size);
  const double kv =
      static_cast<double>(m.num_kv_heads) / static_cast<double>(m.num_attention_heads);
  const double mlp = (m.arch == "gpt_neox" ? 2.0 : 3.0) * h * f;
  const double layer = h * h * (2.0 + 2.0 * kv) + mlp;
  const double head = static_cast<double>(m.vocab_size) * h;
  const double weights = static_cast<double>(m.num_layers) * layer + head;
  return 6.0 * weights +
         6.0 * static_cast<double>(m.num_layers) * h * static_cast<double>(c.data.seq_length);
}

struct Prediction {
  TrainConfig cfg;
  MemoryPlan plan;
  const RankMemory* slowest = nullptr;
  double step = 0, seq_s = 0, tokens_s = 0, mfu = 0;
};

Prediction predict(const TrainConfig& cfg, const sim::MachineSpec& m, const std::string& timeline) {
  Prediction p{cfg, plan_memory(cfg, {.time_step = true, .timeline_path = timeline}), nullptr};
  p.plan.host_ram_bytes = 0;  // the plan is for the modeled cluster, not this host
  p.slowest = &*std::max_element(p.plan.ranks.begin(), p.plan.ranks.end(),
                                 [](auto& a, auto& b) { return a.step_seconds < b.step_seconds; });
  p.step = p.slowest->step_seconds;
  p.seq_s = static_cast<double>(cfg.data.global_batch_size) / p.step;
  p.tokens_s = p.seq_s * static_cast<double>(cfg.data.seq_length);
  const bool bf16 = cfg.precision.type != "fp32";
  p.mfu = model_flops_per_token(cfg) * p.tokens_s /
          (static_cast<double>(m.world_size()) * m.peak_flops(bf16));
  return p;
}

std::string layout(const TrainConfig& c) {
  const auto& d = c.dist;
  return str("TP ", d.tensor_model_parallel_size, " x PP ", d.pipeline_model_parallel_size,
             " x DP ", d.data_parallel_size, ", micro batch ", c.data.micro_batch_size, " (",
             c.grad_accum_steps, " per step), ", d.zero1 ? "ZeRO-1, " : "", "checkpointing ",
             checkpoint_granularity_name(c.model.activations_checkpoint_granularity));
}

void print_prediction(const Prediction& p) {
  const RankMemory& w = p.plan.worst();
  const double gib = 1024.0 * 1024 * 1024;
  std::printf("%s\n", p.plan.report().c_str());
  const RankMemory& s = *p.slowest;
  std::printf(
      "step (modeled, rank %d, stage %d): %.4f s = compute %.4f s + exposed communication "
      "%.4f s + pipeline bubble %.4f s\n",
      s.rank, s.stage, s.step_seconds, s.compute_seconds, s.exposed_comm_seconds(),
      s.bubble_seconds);
  std::printf(
      "predicted: %.3f seq/s, %.0f tokens/s, MFU %.3f, step %.4f s, memory %.2f GiB of "
      "%.2f GiB per core (%s)\n",
      p.seq_s, p.tokens_s, p.mfu, p.step, static_cast<double>(w.total()) / gib,
      static_cast<double>(p.plan.hbm_bytes) / gib, p.plan.fits_hbm() ? "fits" : "does not fit");
}

// The TP x PP x DP layouts of the world with each micro batch (the configured one, halved down to
// 1), and for each the choices of ZeRO-1 and activation checkpointing in the order they cost
// time: no ZeRO-1 and less recomputation first, so the first that fits is the fastest of its
// group (the ones after it only trade time for memory).
std::vector<std::vector<TrainConfig>> candidates(const Args& a, const sim::MachineSpec& m) {
  const TrainConfig base = resolve(make_config(a, m));
  std::vector<std::vector<TrainConfig>> out;
  const int64_t W = m.world_size();
  for (int64_t tp = 1; tp <= std::min<int64_t>(W, 32); tp *= 2)
    for (int64_t pp = 1; tp * pp <= W && pp <= base.model.num_layers; pp *= 2) {
      const int64_t dp = W / (tp * pp);
      if (W % (tp * pp) != 0) continue;
      for (int64_t mb = base.data.micro_batch_size; mb >= 1; mb /= 2) {
        std::vector<TrainConfig> choices;
        for (bool z : {false, true})
          for (const char* ck : {"null", "selective", "full"}) {
            if ((z && dp == 1) || base.data.global_batch_size % (dp * mb) != 0) continue;
            Config c = make_config(a, m);
            c.apply_override(str("distributed_strategy.tensor_model_parallel_size=", tp));
            c.apply_override(str("distributed_strategy.pipeline_model_parallel_size=", pp));
            c.apply_override(str("data.micro_batch_size=", mb));
            c.apply_override(str("distributed_strategy.zero1=", z ? "true" : "false"));
            c.apply_override(str("model.activations_checkpoint_granularity=", ck));
            try {
              choices.push_back(resolve(c));
            } catch (const UserError&) {  // a layout the model does not allow (heads, layers)
            }
          }
        if (!choices.empty()) out.push_back(std::move(choices));
      }
    }
  return out;
}

int64_t rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

int run(int argc, char** argv) {
  const auto t0 = std::chrono::steady_clock::now();
  const Args a = parse(argc, argv);
  const sim::MachineSpec m = sim::cluster(sim::machine(a.instance), a.nodes);
  int code = 0;
  if (!a.search) {
    const Prediction p = predict(resolve(make_config(a, m)), m, a.timeline);
    std::printf("nxd-plan: %s on %s (%d NeuronCores): %s, global batch %lld x %lld tokens, %s\n",
                a.model.empty() ? p.cfg.model.arch.c_str() : a.model.c_str(), m.name.c_str(),
                m.world_size(), layout(p.cfg).c_str(),
                static_cast<long long>(p.cfg.data.global_batch_size),
                static_cast<long long>(p.cfg.data.seq_length), p.cfg.precision.type.c_str());
    print_prediction(p);
    code = p.plan.fits_hbm() ? 0 : 3;
  } else {
    std::vector<Prediction> fit;
    int planned = 0, layouts = 0;
    for (const std::vector<TrainConfig>& choices : candidates(a, m)) {
      ++layouts;
      for (const TrainConfig& c : choices) {
        ++planned;
        if (!plan_memory(c).fits_hbm()) continue;  // memory first: only what fits is timed
        fit.push_back(predict(c, m, ""));
        break;
      }
    }
    std::sort(fit.begin(), fit.end(), [](auto& x, auto& y) { return x.tokens_s > y.tokens_s; });
    std::printf(
        "nxd-plan --search: %d TP x PP x DP x micro batch layouts of %s on %s (%d choices "
        "of ZeRO-1 and checkpointing planned), %zu fit; the fastest:\n",
        layouts, a.model.empty() ? "the model" : a.model.c_str(), m.name.c_str(), planned,
        fit.size());
    for (size_t i = 0; i < fit.size() && i < 10; ++i)
      std::printf("%2zu. %s: %.3f seq/s, %.0f tokens/s, MFU %.3f, step %.4f s, memory %.2f GiB\n",
                  i + 1, layout(fit[i].cfg).c_str(), fit[i].seq_s, fit[i].tokens_s, fit[i].mfu,
                  fit[i].step,
                  static_cast<double>(fit[i].plan.worst().total()) / (1024.0 * 1024 * 1024));
    code = fit.empty() ? 3 : 0;
  }
  std::printf("planner: %.2f s, peak RSS %.1f MiB\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              static_cast<double>(rss_kib()) / 1024.0);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UserError& e) {
    std::fprintf(stderr, "nxd-plan: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nxd-plan: error: %s\n", e.what());
    return 1;
  }
}
