// nxd-plan: will this model fit, and how fast will it train, on N trn1 or trn2 nodes (or a Trn2
// UltraServer)? It runs one real
// training step of nxd-train's configuration (the model, parallel layers, pipeline schedule,
// ZeRO-1, precision, activation checkpointing, gradient accumulation) on meta tensors over the
// sim backend with one rank per NeuronCore of the N nodes (32 per trn1 node, 64 per trn2 node
// at LNC=2; train_app/plan.h): nothing is allocated for data.
//
//   nxd-plan [--config FILE]... [--set key=value]... [--model PRESET] [--instance TYPE]
//            [--nodes N] [--timeline PATH] [--search [--max-plans N]]
//   nxd-plan --inference [--model PRESET] [--instance TYPE] [--set key=value]...
//            [--batch B] [--prompt-tokens P] [--new-tokens M]   (nxd_plan_inference.cpp)
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

#include "nxd/cli/exit.h"
#include "nxd/io/bounded_read.h"
#include "nxd/runtime/error.h"
#include "nxd_plan.h"

using namespace nxd;
using namespace nxd::train_app;
using namespace nxd::plan_tool;

namespace {

// Published model sizes (Hugging Face config.json of each model: meta-llama/Llama-2-7b-hf,
// -13b-hf, -70b-hf, meta-llama/Meta-Llama-3-70B, meta-llama/Llama-3.1-8B, -70B,
// mistralai/Mistral-7B-Instruct-v0.2 (no sliding window, rope_theta 1e6: a Llama shape),
// codellama/CodeLlama-13b-hf (16,384 positions, 32,016 tokens), EleutherAI/gpt-neox-20b).
// gpt3-175b: GPT-3's sizes (Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1:
// 96 layers, d_model 12288, 96 heads, context 2048; d_ff = 4 d_model) on nxd's GPT-NeoX
// architecture (rotary positions and a parallel residual instead of GPT-3's learned positions and
// sequential residual: the same matmul FLOPs), with GPT-2's 50,257-token vocabulary padded to
// 50,304 (a multiple of 128, as Megatron pads it). mixtral-8x7b: mistralai/Mixtral-8x7B-v0.1's
// config.json (8 local experts, 2 per token, router_aux_loss_coef 0.02, rope_theta 1e6).
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
      {"llama3-70b",
       {"model.arch=llama", "model.hidden_size=8192", "model.num_layers=80",
        "model.num_attention_heads=64", "model.num_kv_heads=8", "model.ffn_hidden_size=28672",
        "model.vocab_size=128256", "model.max_position_embeddings=8192",
        "model.rope_theta=500000"}},
      {"mistral-7b",
       {"model.arch=llama", "model.hidden_size=4096", "model.num_layers=32",
        "model.num_attention_heads=32", "model.num_kv_heads=8", "model.ffn_hidden_size=14336",
        "model.vocab_size=32000", "model.max_position_embeddings=32768",
        "model.rope_theta=1000000"}},
      {"codellama-13b",
       {"model.arch=llama", "model.hidden_size=5120", "model.num_layers=40",
        "model.num_attention_heads=40", "model.num_kv_heads=40", "model.ffn_hidden_size=13824",
        "model.vocab_size=32016", "model.max_position_embeddings=16384",
        "model.rope_theta=1000000"}},
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
      {"mixtral-8x7b",
       {"model.arch=mixtral", "model.hidden_size=4096", "model.num_layers=32",
        "model.num_attention_heads=32", "model.num_kv_heads=8", "model.ffn_hidden_size=14336",
        "model.vocab_size=32000", "model.max_position_embeddings=32768", "model.rope_theta=1000000",
        "model.moe.num_experts=8", "model.moe.top_k=2", "model.moe.router_aux_loss_coef=0.02",
        "distributed_strategy.sequence_parallel=false"}},
  };
  return p;
}

const char* kUsage =
    "usage: nxd-plan [--config FILE]... [--set key=value]... [--model PRESET]\n"
    "                [--instance TYPE] [--nodes N] [--timeline PATH]\n"
    "                [--search [--max-plans N (200: the most plans the search makes)]]\n"
    "       nxd-plan --inference [--model PRESET] [--instance TYPE] [--set key=value]...\n"
    "                [--batch B (1)] [--prompt-tokens P (128)] [--new-tokens M (128)]\n"
    "                [--max-context-tokens C (P + M: the largest context-encoding bucket)]\n"
    "                [--prefill-attention materialized|flash (materialized)]\n"
    "                (modeled TTFT, TPOT and output tokens/s at\n"
    "                 distributed_strategy.tensor_model_parallel_size on one instance,\n"
    "                 also inf2.xlarge inf2.8xlarge inf2.24xlarge inf2.48xlarge)\n"
    "  instances: trn1.32xlarge (default) trn1n.32xlarge trn2.48xlarge trn2u.48xlarge trn2u\n"
    "             (the Trn2 UltraServer, 4 instances; --nodes 1) trn3-gen1 trn3-gen2 (the Trn3\n"
    "             Gen1 and Gen2 UltraServers; --nodes 1); a Trainium2 or Trainium3 type runs at\n"
    "             LNC=2, TYPE:lnc=1 at LNC=1 (twice the cores, half the memory and FLOPs each)\n"
    "  presets: llama2-7b llama2-13b llama2-70b llama3-70b llama3.1-8b llama3.1-70b mistral-7b\n"
    "           codellama-13b gpt-neox-20b gpt3-175b mixtral-8x7b\n";

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
      a.nodes = static_cast<int>(io::parse_int(value(), 1, 1024, "--nodes", "nxd-plan"));
      a.nodes_given = true;
    } else if (s == "--inference") {
      a.inference = true;
    } else if (s == "--batch" || s == "--prompt-tokens" || s == "--new-tokens") {
      const int64_t v = io::parse_int(value(), 1, int64_t{1} << 20, s, "nxd-plan");
      (s == "--batch" ? a.batch : s == "--prompt-tokens" ? a.prompt_tokens : a.new_tokens) = v;
      a.inference_sizes_given = true;
    } else if (s == "--prefill-attention") {
      a.prefill_attention = value();
      if (a.prefill_attention != "materialized" && a.prefill_attention != "flash")
        throw UserError(str("[nxd-plan] --prefill-attention '", a.prefill_attention,
                            "': expected materialized or flash"));
      a.inference_sizes_given = true;
    } else if (s == "--max-context-tokens") {
      a.max_context_tokens = io::parse_int(value(), 1, int64_t{1} << 21, s, "nxd-plan");
      a.inference_sizes_given = true;
    } else if (s == "--timeline")
      a.timeline = value();
    else if (s == "--search")
      a.search = true;
    else if (s == "--max-plans")
      a.max_plans = static_cast<int>(io::parse_int(value(), 1, 100000, "--max-plans", "nxd-plan"));
    else if (s == "-h" || s == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else
      throw UserError(str("[nxd-plan] unknown argument '", s, "'\n", kUsage));
  }
  return a;
}

void print_prediction(const Prediction& p) {
  const RankMemory& w = p.plan.worst();
  const double gib = 1024.0 * 1024 * 1024;
  std::printf("%s\n", p.plan.report().c_str());
  const RankMemory& s = *p.slowest;
  char offload[64] = "";
  if (s.offload_seconds > 0)
    std::snprintf(offload, sizeof offload, " + optimizer offload %.4f s", s.offload_seconds);
  std::printf(
      "step (modeled, rank %d, stage %d): %.4f s = compute %.4f s + exposed communication "
      "%.4f s + pipeline bubble %.4f s%s\n",
      s.rank, s.stage, s.step_seconds, s.compute_seconds, s.exposed_comm_seconds(),
      s.bubble_seconds, offload);
  std::printf(
      "predicted: %.3f seq/s, %.0f tokens/s, MFU %.3f, step %.4f s, memory %.2f GiB of "
      "%.2f GiB per core (%s)\n",
      p.seq_s, p.tokens_s, p.mfu, p.step, static_cast<double>(w.total()) / gib,
      static_cast<double>(p.plan.hbm_bytes) / gib, p.plan.fits_hbm() ? "fits" : "does not fit");
}

int64_t rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

int run(int argc, char** argv) {
  const auto t0 = std::chrono::steady_clock::now();
  const Args a = parse(argc, argv);
  if (a.inference) return inference(a);
  if (a.inference_sizes_given)
    throw UserError(
        str("[nxd-plan] --batch, --prompt-tokens, --new-tokens, --max-context-tokens and "
            "--prefill-attention go with --inference\n",
            kUsage));
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
    code = search(a, m);
  }
  std::printf("planner: %.2f s, peak RSS %.1f MiB\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              static_cast<double>(rss_kib()) / 1024.0);
  return code;
}

}  // namespace

Config plan_tool::make_config(const Args& a, const sim::MachineSpec& m) {
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

Prediction plan_tool::predict(const TrainConfig& cfg, const sim::MachineSpec& m,
                              const std::string& timeline) {
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

std::string plan_tool::layout(const TrainConfig& c) {
  const auto& d = c.dist;
  return str(
      "TP ", d.tensor_model_parallel_size, " x PP ", d.pipeline_model_parallel_size, " x DP ",
      d.data_parallel_size,
      d.context_parallel_size > 1 ? str(" x CP ", d.context_parallel_size) : std::string(),
      d.expert_model_parallel_size > 1 ? str(", EP ", d.expert_model_parallel_size) : std::string(),
      ", micro batch ", c.data.micro_batch_size, " (", c.grad_accum_steps, " per step), ",
      d.zero1() ? str("ZeRO-", optim::zero_stage_name(d.zero_stage), ", ") : std::string(),
      "checkpointing ", checkpoint_granularity_name(c.model.activations_checkpoint_granularity));
}

int main(int argc, char** argv) {
  return cli::run_main("nxd-plan", [&] {
    try {
      return run(argc, argv);
    } catch (const OutOfDeviceMemory& e) {  // a model found not to fit before planning
      std::fprintf(stderr, "nxd-plan: %s\n", io::one_line(e.what()).c_str());
      return 3;  // as a plan that does not fit
    }
  });
}
