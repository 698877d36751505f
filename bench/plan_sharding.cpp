// nxd-bench-plan-sharding: what each sharding level buys on N trn1 and trn2 nodes (or one Trn3
// UltraServer: --instances trn3-gen1; no offload there, its host side is unpublished), by
// nxd-plan's planner (train_app/plan.h). For every instance type, node count and level (ZeRO 0, 1,
// 2, 3, and 1, 2 and 3 with optimizer offload) it finds the largest model of a family of Llama
// shapes whose plan fits a NeuronCore's HBM (and, with offload, whose offloaded state fits the
// node's host memory), and prints its memory per core, modeled step and MFU. First, the wall time
// and peak RSS of one 1,024-rank plan (16 trn2.48xlarge at LNC=2, the 70B shape, ZeRO-1, the step
// timed).
//
//   nxd-bench-plan-sharding [--nodes 1,4,16] [--instances trn1.32xlarge,trn2.48xlarge]
//                           [--levels zero0,zero1,zero2,zero1+offload,zero2+offload,zero3,
//                                     zero3+offload]
//                           [--big-plan-nodes N (16; 0: skip)]
//
// The layout is fixed so that the levels compare alone: TP 8 with sequence parallelism, PP 1,
// DP = the rest, micro batch 1, full activation checkpointing, sequences of 4,096 tokens, a global
// batch of 1,024 sequences (NxD Training's Llama recipes), mixed precision. The planner's figures
// are modeled, not measured: the machine running the bench only bounds the planner's own time.
//
// The family (Hugging Face config.json of each; Llama 2's 32,000-token vocabulary throughout):
// meta-llama/Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B, Llama-2-13b-hf, codellama/CodeLlama-34b-hf,
// meta-llama/Llama-2-70b-hf, Llama-3.1-405B; and llama-20b, a shape of nxd's between 13B and 34B
// (hidden 6144, 48 layers, 48 heads, 8 KV heads, FFN 16384: 19B) so that the levels' gains show.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "nxd/cli/exit.h"
#include "nxd/io/bounded_read.h"
#include "nxd/runtime/cpu_info.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/sim/machine.h"
#include "nxd/train_app/config.h"
#include "nxd/train_app/plan.h"

using namespace nxd;
using namespace nxd::train_app;

namespace {

struct Shape {
  const char* name;
  int64_t hidden, layers, heads, kv_heads, ffn;
};
const std::vector<Shape> kFamily = {
    {"llama-1b", 2048, 16, 32, 8, 8192},   {"llama-3b", 3072, 28, 24, 8, 8192},
    {"llama-8b", 4096, 32, 32, 8, 14336},  {"llama-13b", 5120, 40, 40, 40, 13824},
    {"llama-20b", 6144, 48, 48, 8, 16384}, {"llama-34b", 8192, 48, 64, 8, 22016},
    {"llama-70b", 8192, 80, 64, 8, 28672}, {"llama-405b", 16384, 126, 128, 8, 53248},
};

struct Level {
  std::string name;
  std::vector<std::string> keys;
  int at_least = -1;  // a level needing no more memory than this one (-1: none): start there
};
std::vector<Level> all_levels() {
  const std::string off = "distributed_strategy.optimizer_offload=true";
  return {{"zero0", {"distributed_strategy.zero_stage=0"}, -1},
          {"zero1", {"distributed_strategy.zero_stage=1"}, 0},
          {"zero2", {"distributed_strategy.zero_stage=2"}, 1},
          {"zero1+offload", {"distributed_strategy.zero_stage=1", off}, 1},
          {"zero2+offload", {"distributed_strategy.zero_stage=2", off}, 2},
          {"zero3", {"distributed_strategy.zero_stage=3"}, 2},
          {"zero3+offload", {"distributed_strategy.zero_stage=3", off}, 5}};
}

constexpr int kTp = 8;
constexpr size_t kBig = 6;  // llama-70b: the 1,024-rank plan's model

TrainConfig make(const Shape& s, const sim::MachineSpec& m, const Level& l) {
  Config c;
  for (const std::string& k : std::vector<std::string>{
           "data.kind=random", "generation.max_new_tokens=0", "model.arch=llama",
           str("model.hidden_size=", s.hidden), str("model.num_layers=", s.layers),
           str("model.num_attention_heads=", s.heads), str("model.num_kv_heads=", s.kv_heads),
           str("model.ffn_hidden_size=", s.ffn), "model.vocab_size=32000",
           "model.max_position_embeddings=4096", "data.seq_length=4096", "data.micro_batch_size=1",
           "data.global_batch_size=1024", "precision.type=mixed_precision",
           "model.activations_checkpoint_granularity=full",
           str("distributed_strategy.tensor_model_parallel_size=", kTp),
           "distributed_strategy.sequence_parallel=true",
           str("backend.world_size=", m.world_size()), "backend.instance=" + m.name})
    c.apply_override(k);
  for (const std::string& k : l.keys) c.apply_override(k);
  return resolve(c);
}

double params_of(const Shape& s) {
  const double h = static_cast<double>(s.hidden);
  const double kv = static_cast<double>(s.kv_heads) / static_cast<double>(s.heads);
  const double layer = h * h * (2.0 + 2.0 * kv) + 3.0 * h * static_cast<double>(s.ffn) + 2.0 * h;
  return static_cast<double>(s.layers) * layer + 2.0 * 32000.0 * h + h;
}

// The offloaded state of the node's ranks against its host memory.
int64_t host_bytes_per_node(const MemoryPlan& p, const sim::MachineSpec& m) {
  int64_t most = 0;
  for (int node = 0; node < m.instances; ++node) {
    int64_t sum = 0;
    for (const RankMemory& r : p.ranks)
      if (m.instance_of(r.rank) == node) sum += r.host_optimizer_state;
    most = std::max(most, sum);
  }
  return most;
}

bool fits(const MemoryPlan& p, const sim::MachineSpec& m) {
  return p.fits_hbm() && host_bytes_per_node(p, m) <= m.host_memory_bytes;
}

double gib(int64_t b) {
  return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0);
}

double rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The largest shape from `start` up that fits (-1: none), and the plans it took.
int largest_fitting(const sim::MachineSpec& m, const Level& l, int start, int* plans) {
  int best = -1;
  for (int i = std::max(start, 0); i < static_cast<int>(kFamily.size()); ++i) {
    const TrainConfig cfg = make(kFamily[static_cast<size_t>(i)], m, l);
    if (min_parameter_bytes_per_rank(cfg) > static_cast<double>(m.core.hbm_bytes)) break;
    ++*plans;
    MemoryPlan p;
    try {
      p = plan_memory(cfg, {.host_ram_bytes = int64_t{1} << 62});
    } catch (const OutOfDeviceMemory&) {
      break;
    }
    if (!fits(p, m)) break;
    best = i;
  }
  // The level assumed to need no more memory than `start`'s did not fit it (ZeRO-2 under gradient
  // accumulation keeps the full gradients, more than ZeRO-1): search from the smallest shape.
  if (best < 0 && start > 0) return largest_fitting(m, l, 0, plans);
  return best;
}

void run_case(const sim::MachineSpec& m, const Level& l, int start, int* found) {
  const auto t0 = std::chrono::steady_clock::now();
  int plans = 0;
  const int best = largest_fitting(m, l, start, &plans);
  *found = best;
  if (best < 0) {
    std::printf("instance=%s nodes=%d cores=%d level=%s largest=none plans=%d planner_s=%.1f\n",
                m.name.c_str(), m.instances, m.world_size(), l.name.c_str(), plans, since(t0));
    return;
  }
  const Shape& s = kFamily[static_cast<size_t>(best)];
  const TrainConfig cfg = make(s, m, l);
  const MemoryPlan p = plan_memory(cfg, {.host_ram_bytes = int64_t{1} << 62, .time_step = true});
  double step = 0, offload = 0;
  for (const RankMemory& r : p.ranks) {
    step = std::max(step, r.step_seconds);
    offload = std::max(offload, r.offload_seconds);
  }
  const double tokens_s =
      static_cast<double>(cfg.data.global_batch_size * cfg.data.seq_length) / step;
  const double mfu = model_flops_per_token(cfg) * tokens_s /
                     (static_cast<double>(m.world_size()) * m.peak_flops(true));
  const RankMemory& w = p.worst();
  std::printf(
      "instance=%s nodes=%d cores=%d level=%s largest=%s params_b=%.1f tp=%d dp=%lld "
      "memory_gib_per_core=%.2f hbm_gib=%.0f host_state_gib_per_core=%.2f "
      "host_gib_per_node=%.1f step_s=%.3f offload_s=%.3f tokens_s=%.0f mfu=%.3f plans=%d "
      "planner_s=%.1f\n",
      m.name.c_str(), m.instances, m.world_size(), l.name.c_str(), s.name, params_of(s) / 1e9, kTp,
      static_cast<long long>(cfg.dist.data_parallel_size), gib(w.total()), gib(m.core.hbm_bytes),
      gib(w.host_optimizer_state), gib(host_bytes_per_node(p, m)), step, offload, tokens_s, mfu,
      plans + 1, since(t0));
  std::fflush(stdout);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

int run(int argc, char** argv) {
  std::vector<std::string> nodes = {"1", "4", "16"}, instances = {"trn1.32xlarge", "trn2.48xlarge"};
  std::vector<std::string> wanted;
  int64_t big_nodes = 16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw UserError(str("[nxd-bench-plan-sharding] ", a, " needs a value"));
    const std::string v = argv[++i];
    if (a == "--nodes")
      nodes = split(v);
    else if (a == "--instances")
      instances = split(v);
    else if (a == "--levels")
      wanted = split(v);
    else if (a == "--big-plan-nodes")
      big_nodes = io::parse_int(v, 0, 64, "--big-plan-nodes", "nxd-bench-plan-sharding");
    else
      throw UserError(str("[nxd-bench-plan-sharding] unknown argument '", a,
                          "' (--nodes, --instances, --levels, --big-plan-nodes)"));
  }
  const std::vector<Level> levels = all_levels();
  std::vector<bool> on(levels.size(), wanted.empty());
  for (const std::string& w : wanted) {
    size_t k = 0;
    while (k < levels.size() && levels[k].name != w) ++k;
    if (k == levels.size())
      throw UserError(
          str("[nxd-bench-plan-sharding] unknown level '", w,
              "' (zero0, zero1, zero2, zero1+offload, zero2+offload, zero3, zero3+offload)"));
    on[k] = true;
  }
  std::printf("# %s\n# load average %.2f\n", cpu::describe().c_str(), cpu::load_average());
  std::printf(
      "# layout: TP %d + SP, PP 1, DP the rest, micro batch 1, full checkpointing, seq 4096, "
      "global batch 1024, mixed precision; figures modeled by the planner\n",
      kTp);
  if (big_nodes > 0) {  // first: the process's peak RSS is then this plan's
    const sim::MachineSpec m =
        sim::cluster(sim::machine("trn2.48xlarge"), static_cast<int>(big_nodes));
    const auto t0 = std::chrono::steady_clock::now();
    const MemoryPlan p = plan_memory(make(kFamily[kBig], m, levels[1]),
                                     {.host_ram_bytes = int64_t{1} << 62, .time_step = true});
    std::printf(
        "case=big_plan instance=%s ranks=%d model=%s level=zero1 wall_s=%.2f "
        "peak_rss_mib=%.1f fits=%d\n",
        m.name.c_str(), m.world_size(), kFamily[kBig].name, since(t0), rss_mib(),
        p.fits_hbm() ? 1 : 0);
    std::fflush(stdout);
  }
  for (const std::string& inst : instances)
    for (const std::string& n : nodes) {
      const sim::MachineSpec one = sim::machine(inst);  // an unknown name stops the bench
      const int count =
          static_cast<int>(io::parse_int(n, 1, 64, "--nodes", "nxd-bench-plan-sharding"));
      if (one.ultraserver && count > 1) {  // one scale-up domain: clusters of them not modeled
        std::printf("instance=%s nodes=%d skipped=an UltraServer is not clustered\n", inst.c_str(),
                    count);
        continue;
      }
      const sim::MachineSpec m = sim::cluster(one, count);
      std::vector<int> found(levels.size(), -1);
      for (size_t k = 0; k < levels.size(); ++k) {
        if (!on[k]) continue;
        if (levels[k].name.find("offload") != std::string::npos && !m.host_unknown.empty()) {
          std::printf("instance=%s level=%s skipped=host side not published\n", m.name.c_str(),
                      levels[k].name.c_str());
          continue;  // found[k] stays -1: a later level starts from its own base
        }
        const int base = levels[k].at_least;
        run_case(m, levels[k],
                 base >= 0 && on[static_cast<size_t>(base)] ? found[static_cast<size_t>(base)] : 0,
                 &found[k]);
      }
    }
  std::printf("# after: load average %.2f, peak RSS %.1f MiB\n", cpu::load_average(), rss_mib());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::run_main("nxd-bench-plan-sharding", [&] { return run(argc, argv); });
}
