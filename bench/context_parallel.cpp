// nxd-bench-context-parallel: context parallelism's activation peak (the allocator's) and modeled
// step time against CP 1, and a sequence CP times longer than one rank holds training.
//
// Part 1 (meta tensors on the sim device: the allocator counts them, the kernels and collectives
// charge the modeled clock, nothing is computed): one forward + backward + the DP x CP gradient
// all-reduce of a Llama at a long sequence, at CP 1, 2 and 4 (world = CP). Activation peak = the
// rank's allocator peak during the step above what it held before (parameters and gradient
// buffers); step = the slowest rank's modeled time.
//
// Part 2 (real tensors): a small Llama on ranks whose device memory is capped (sim
// memory_capacity) so that CP 1 cannot hold the sequence (OutOfDeviceMemory), then CP 2 trains it
// for a few AdamW steps (the loss falls).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/parallel/context_parallel.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/optim/optimizer.h"
#include "nxd/runtime/sim/clock.h"

using namespace nxd;
namespace ps = nxd::parallel_state;

namespace {

struct Flags {
  int64_t seq = 32768, hidden = 2048, layers = 4, heads = 16, kv_heads = 8, vocab = 32000;
  int64_t real_seq = 1024, real_hidden = 64;
  int real_steps = 3;
};

[[noreturn]] void usage(const char* bad) {
  std::fprintf(stderr,
               "usage: nxd-bench-context-parallel [--seq N] [--hidden N] [--layers N] "
               "[--heads N] [--kv-heads N] [--vocab N] [--real-seq N] [--real-hidden N] "
               "[--real-steps N]\n(unknown or bad flag: %s)\n",
               bad);
  std::exit(2);
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(argv[i]);
    char* end = nullptr;
    const long long v = std::strtoll(argv[++i], &end, 10);
    if (*end != '\0' || v <= 0) usage(argv[i]);
    if (a == "--seq")
      f.seq = v;
    else if (a == "--hidden")
      f.hidden = v;
    else if (a == "--layers")
      f.layers = v;
    else if (a == "--heads")
      f.heads = v;
    else if (a == "--kv-heads")
      f.kv_heads = v;
    else if (a == "--vocab")
      f.vocab = v;
    else if (a == "--real-seq")
      f.real_seq = v;
    else if (a == "--real-hidden")
      f.real_hidden = v;
    else if (a == "--real-steps")
      f.real_steps = static_cast<int>(v);
    else
      usage(a.c_str());
  }
  return f;
}

// The measured model: the flags' sizes, bf16 on the meta device (shapes only).
ModelConfig meta_model(const Flags& f) {
  return {.vocab_size = f.vocab,
          .num_layers = f.layers,
          .hidden_size = f.hidden,
          .num_attention_heads = f.heads,
          .num_kv_heads = f.kv_heads,
          .max_position_embeddings = f.seq,
          .dtype = DType::bf16,
          .device = Device::meta};
}

// The model trained for real: 2 layers of 2 heads (no GQA), a 256-token vocabulary, f32.
ModelConfig real_model(const Flags& f, Device dev) {
  return {.vocab_size = 256,
          .num_layers = 2,
          .hidden_size = f.real_hidden,
          .num_attention_heads = 2,
          .num_kv_heads = 2,
          .max_position_embeddings = f.real_seq,
          .dtype = DType::f32,
          .device = dev};
}

struct StepFigures {
  double activation_peak = 0;  // bytes, the largest rank
  double step_seconds = 0;     // modeled, the slowest rank
  double comm_seconds = 0;     // modeled communication of the slowest rank
};

// One meta step at context parallel size cp (world cp).
StepFigures meta_step(const Flags& f, int cp) {
  StepFigures out;
  std::vector<double> act(cp), step(cp), comm(cp);
  sim::launch({.world_size = cp, .memory_capacity = 0}, [&] {
    ps::initialize_model_parallel(ps::ParallelSizes{.context = cp});
    const ModelConfig c = meta_model(f);
    auto m = make_causal_lm(c, 1);
    optim::GradSync sync(*m, {.mode = optim::GradSyncMode::at_step});
    const Tensor ids = zeros({1, f.seq / cp}, DType::i64, Device::meta);
    MemoryCounter& mem = current_context().memory();
    sim::SimClock* clock = sim::current_sim_clock();
    world().barrier();
    const int64_t before = mem.live();
    mem.reset_peak();
    const double t0 = clock->now(), c0 = clock->comm_seconds();
    backward(m->loss(ids, ids));
    sync.finish();
    const int r = current_context().rank();
    act[r] = double(mem.peak() - before);
    step[r] = clock->now() - t0;
    comm[r] = clock->comm_seconds() - c0;
  });
  for (int r = 0; r < cp; ++r) {
    out.activation_peak = std::max(out.activation_peak, act[r]);
    if (step[r] > out.step_seconds) out.step_seconds = step[r], out.comm_seconds = comm[r];
  }
  return out;
}

// Part 2: real training of real_seq tokens at CP cp on ranks capped at `capacity` bytes; returns
// the losses, or the error's first line.
std::vector<double> real_train(const Flags& f, int cp, int64_t capacity, std::string& error) {
  std::vector<double> losses;
  try {
    sim::launch({.world_size = cp, .memory_capacity = capacity}, [&] {
      ps::initialize_model_parallel(ps::ParallelSizes{.context = cp});
      const ModelConfig c = real_model(f, Device::host);
      auto m = make_causal_lm(c, 1);
      optim::GradSync sync(*m, {.mode = optim::GradSyncMode::at_step});
      std::vector<optim::NamedParam> params;
      for (auto& [n, t] : m->named_parameters()) params.push_back({n, t});
      optim::AdamW opt(optim::default_param_groups(params, 3e-3, 0.0));
      // one fixed sequence (a repeating pattern the model can learn), this rank's chunks
      std::vector<int64_t> v(f.real_seq + 1);
      for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t((i * 7 + i / 13) % 256);
      const Tensor all = from_vector<int64_t>(v, {1, f.real_seq + 1});
      const int r = ps::get_context_parallel_rank();
      const Tensor ids = context_parallel_slice(all.narrow(1, 0, f.real_seq), 1, r, cp);
      const Tensor tg = context_parallel_slice(all.narrow(1, 1, f.real_seq), 1, r, cp);
      for (int s = 0; s < f.real_steps; ++s) {
        opt.zero_grad(/*set_to_none=*/true);
        Tensor loss = m->loss(ids, tg);
        backward(loss);
        sync.finish();
        opt.step();
        if (r == 0) losses.push_back(loss.item());
      }
    });
  } catch (const std::exception& e) {
    error = e.what();
    error = error.substr(0, error.find('\n'));
  }
  return losses;
}

// The real model's activation peak at CP 1 and its resident bytes, to set the cap between them.
std::pair<int64_t, int64_t> real_footprint(const Flags& f) {
  int64_t resident = 0, peak = 0;
  sim::launch({.world_size = 1, .memory_capacity = 0}, [&] {
    const ModelConfig c = real_model(f, Device::meta);
    auto m = make_causal_lm(c, 1);
    std::vector<optim::NamedParam> params;
    for (auto& [n, t] : m->named_parameters()) params.push_back({n, t});
    MemoryCounter& mem = current_context().memory();
    const Tensor ids = zeros({1, f.real_seq}, DType::i64, Device::meta);
    backward(m->loss(ids, ids));  // gradients allocated
    int64_t param_bytes = 0;
    for (auto& p : params) param_bytes += p.param.nbytes();
    resident = mem.live() + 2 * param_bytes;  // parameters, gradients, AdamW's two moments
    mem.reset_peak();
    const int64_t before = mem.live();
    for (auto& p : params) p.param.grad().zero_();
    backward(m->loss(ids, ids));
    peak = mem.peak() - before;
  });
  return {resident, peak};
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = parse(argc, argv);
  std::printf(
      "# part 1: Llama hidden %lld, %lld layers, %lld heads (%lld kv), vocab %lld, bf16, "
      "one sequence of %lld tokens; meta tensors on the sim device (trn1.32xlarge)\n",
      (long long)f.hidden, (long long)f.layers, (long long)f.heads, (long long)f.kv_heads,
      (long long)f.vocab, (long long)f.seq);
  StepFigures base;
  for (int cp : {1, 2, 4}) {
    if (f.seq % (2 * cp) != 0) continue;
    const StepFigures s = meta_step(f, cp);
    if (cp == 1) base = s;
    std::printf(
        "cp=%d seq=%lld activation_peak_bytes=%.0f (%.2f GiB) ratio_vs_cp1=%.3f "
        "modeled_step_s=%.4f ratio_vs_cp1=%.3f modeled_comm_s=%.4f\n",
        cp, (long long)f.seq, s.activation_peak, s.activation_peak / double(1 << 30),
        s.activation_peak / base.activation_peak, s.step_seconds,
        s.step_seconds / base.step_seconds, s.comm_seconds);
  }
  // part 2
  const auto [resident, peak] = real_footprint(f);
  const int64_t cap = resident + peak * 3 / 4;  // CP 1 needs the whole peak; CP 2 about half
  std::printf(
      "# part 2: Llama hidden %lld, 2 layers, f32, %lld tokens, real tensors; device "
      "memory capped at %.2f MiB per rank (resident %.2f MiB + 0.75 x CP 1's activation "
      "peak %.2f MiB)\n",
      (long long)f.real_hidden, (long long)f.real_seq, cap / 1048576.0, resident / 1048576.0,
      peak / 1048576.0);
  for (int cp : {1, 2}) {
    std::string err;
    const std::vector<double> l = real_train(f, cp, cap, err);
    if (!err.empty()) {
      std::printf("cp=%d seq=%lld trains=no error=\"%s\"\n", cp, (long long)f.real_seq,
                  err.c_str());
      continue;
    }
    std::printf("cp=%d seq=%lld trains=yes steps=%zu loss_first=%.4f loss_last=%.4f\n", cp,
                (long long)f.real_seq, l.size(), l.front(), l.back());
  }
  return 0;
}
