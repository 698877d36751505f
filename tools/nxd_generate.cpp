// nxd-generate: text from a trained (nxd checkpoint) or imported (transformers folder) causal LM
// with the KV cache, at TP 1..8 on the sim backend or under mpirun, and the modeled latency of
// the same generation on a Neuron instance.
//   nxd-generate (--checkpoint DIR | --hf DIR | --gguf FILE) --prompt TEXT [--max-new-tokens N]
//                [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tp N]
//                [--backend sim|mpi] [--eager] [--instance TYPE] [--buckets N,N,...]
//                [--save-trace DIR] [--load-trace DIR] [--tokenizer PATH|bytes]
//                [--quantize int8|int4[:G][:asym][:q8][:head[=int8|int4]]]
//                [--draft-model DIR [--speculate K]]
// By default the model is traced (trace/decoder.h: a context-encoding graph per prompt bucket and
// a token-generation graph sharing the weights and the K/V caches) and generation replays the
// graphs; --eager runs the eager KV-cache path instead (the reference). --quantize int8 or int4
// (int4 in groups of 32, 64 or 128, symmetric or :asym; :head quantizes the output head too, in
// int8 or with :head=int4 in int4) quantizes every decoder linear layer's
// weight at load (layers/models/quantize_lm.h; traced too: the graphs record the quantized ops and
// give eager's tokens) and, eager, prints what it changed on the prompt (largest logit change,
// argmax agreement, perplexity). Both paths print the resident weight bytes of rank 0.
// --draft-model DIR (eager) decodes speculatively (layers/models/speculative.h): the draft (an nxd
// checkpoint or a transformers folder with the same vocabulary) proposes --speculate K tokens
// (default 4) that the model verifies in one step; greedy output is the model's own, sampled
// output follows its distribution; prints the acceptance rate and tokens per verification step.
// --quality-report TEXT (no generation) prints the perplexity of the text for fp32, bf16, int8 and
// int4 weights (each also with an int8 output head) and each one's largest logit change against
// fp32 (tools/generate_quality.h).
// --save-trace
// writes the traced model (trace/save_load.h); --load-trace runs a saved one without
// --checkpoint/--hf. Tokens: a transformers tokenizer.json (--tokenizer PATH, or --hf DIR's
// tokenizer.json when there is one; io/tokenizer.h) encodes the prompt and decodes the text, or
// bytes (as nxd-train's data without data.tokenizer; --tokenizer bytes): the prompt's bytes are its
// ids. Prints the text (prompt and generated; bytes: ids >= 256 as '?'; a tokenizer: ids past its
// vocabulary left out, said so), `tokens: <ids>` (the prompt's and the generated ids, what
// CausalLM::generate returns), the tokenizer, prefill and decode tokens/s on this host, and the
// modeled time to first token and time per output token on the instance
// (layers/models/inference_model.h). Exit codes: 0 done, 2 a user mistake (flag, path, a model
// that does not split over --tp), 1 anything else.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "generate_cli.h"
#include "generate_quality.h"
#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/gguf_llama.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/lora_files.h"
#include "nxd/checkpoint/model_source.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/cli/exit.h"
#include "nxd/collectives/mpi/mpi.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/io/bounded_read.h"
#include "nxd/io/env_check.h"
#include "nxd/io/safetensors.h"
#include "nxd/io/tokenizer.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/inference_model.h"
#include "nxd/layers/models/quantize_lm.h"
#include "nxd/layers/models/speculative.h"
#include "nxd/trace/decoder.h"
#include "nxd/trace/save_load.h"

namespace fs = std::filesystem;
using namespace nxd;

namespace {

using namespace nxd::generate_cli;
using ckpt::build_model;
using ckpt::ModelSource;

std::string gib(double b) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  return buf;
}

// Before anything is built or read (a config of a million layers allocated until the process
// aborted at 3.9 GiB): the model's weights in its dtype (ModelConfig::min_parameter_count, a
// lower bound) over the --tp NeuronCores' HBM, and over the RAM of this host, which every sim
// rank shares. OutOfDeviceMemory (exit 2) with the figures.
void check_model_fits(const ModelConfig& m, const GenerateCli& c, const std::string& source) {
  const double weights = m.min_parameter_count() * static_cast<double>(dtype_size(m.dtype));
  const sim::MachineSpec machine = sim::machine(c.instance);
  const std::string sizes = str(" (", source, ": ", m.num_layers, " layers, hidden size ",
                                m.hidden_size, ", vocabulary ", m.vocab_size, ")");
  if (weights / c.tp > static_cast<double>(machine.core.hbm_bytes))
    throw OutOfDeviceMemory(
        str("[nxd-generate] the model does not fit: its weights alone need at "
            "least ",
            gib(weights / c.tp), " per NeuronCore at TP ", c.tp, ", over the ",
            gib(static_cast<double>(machine.core.hbm_bytes)), " HBM of a ", machine.name,
            " NeuronCore", sizes));
  const double ram = static_cast<double>(host_ram_bytes());
  if (ram > 0 && weights > ram)
    throw OutOfDeviceMemory(
        str("[nxd-generate] the model does not fit in host memory: its "
            "weights alone need at least ",
            gib(weights), ", over this host's ", gib(ram), " of RAM", sizes));
}

// The model's source as the command line names it.
ModelSource resolve_source(const GenerateCli& c) {
  if (c.quantize != WeightQuant::none && !c.checkpoint.empty() &&
      ckpt::is_quantized_checkpoint(c.checkpoint))
    throw Usage(str("--quantize ", describe(c.quant), " on --checkpoint ", c.checkpoint,
                    ", which is quantized already (",
                    describe(ckpt::read_quantized_checkpoint(c.checkpoint).opts),
                    "): drop --quantize, or quantize the unquantized checkpoint"));
  return ckpt::resolve_model_source(
      {.tool = "nxd-generate",
       .checkpoint = c.checkpoint,
       .hf = c.hf,
       .gguf = c.gguf,
       .lora = c.lora,
       .tp = c.tp,
       .check_config = [&c](const ModelConfig& m, const std::string& source) {
         check_model_fits(m, c, source);
       }});
}

// The draft model's source: --draft-model DIR as a transformers folder when it has a
// config.json, else as an nxd checkpoint; its vocabulary must be the model's.
ModelSource resolve_draft(const GenerateCli& c, const ModelSource& target) {
  GenerateCli d = c;
  d.lora.clear();
  d.quantize = WeightQuant::none;  // --quantize is the model's, not the draft's
  ckpt::ModelSourceOptions from;
  ckpt::set_source_path(from, c.draft_model);  // a GGUF file, a transformers folder, a checkpoint
  d.checkpoint = from.checkpoint, d.hf = from.hf, d.gguf = from.gguf;
  ModelSource s = resolve_source(d);
  if (s.cfg.vocab_size != target.cfg.vocab_size)
    throw Usage(str("--draft-model ", c.draft_model, " has vocab_size ", s.cfg.vocab_size,
                    ", the model has ", target.cfg.vocab_size,
                    " (a draft must share the model's tokenizer)"));
  return s;
}

// The prompt's and the text's tokens: a tokenizer.json or bytes, read before any rank starts.
struct Tokens {
  std::shared_ptr<const io::Tokenizer> tok;  // null: bytes
  std::string line;                          // what the report's `tokenizer:` line says
};

Tokens load_tokens(const GenerateCli& c) {
  std::string path = c.tokenizer, why;
  if (path.empty() && !c.hf.empty() && fs::is_regular_file(fs::path(c.hf) / "tokenizer.json")) {
    path = (fs::path(c.hf) / "tokenizer.json").string();
    why = " (found in --hf's folder; --tokenizer bytes for byte tokens)";
  }
  if (path.empty() || path == "bytes") return {nullptr, "bytes (the prompt's bytes are its ids)"};
  auto tok = std::make_shared<const io::Tokenizer>(io::Tokenizer::from_file(path));
  return {tok, str(path, ": ", tok->description(), why)};
}

// This rank's model (inside a sim rank or an MPI process): built at TP, weights loaded.
std::shared_ptr<CausalLM> load_model(const GenerateCli& c, const ModelSource& s) {
  parallel_state::initialize_model_parallel(c.tp);
  return build_model(s);
}

void print_quantize_summary(const QuantizedLmReport& r, const QuantizeOptions& o) {
  const QuantizeSummary& q = r.summary;
  std::printf("quantized: %s weights in %lld linear layers, %.2f MB -> %.2f MB",
              describe(o).c_str(), (long long)q.layers, q.bytes_before / 1e6, q.bytes_after / 1e6);
  if (r.head.layers > 0)
    std::printf("; output head %s, %.2f MB -> %.2f MB (embedding unquantized)\n",
                weight_quant_name(o.head), r.head.bytes_before / 1e6, r.head.bytes_after / 1e6);
  else
    std::printf(" (embedding and output head unquantized)\n");
}

// The bytes rank 0's weights hold in memory (a quantized layer's f32 weight is freed), when it
// has quantized layers (beside the quantization lines; an unquantized run's stdout begins with its
// text).
void print_weight_bytes(CausalLM& m) {
  const WeightBytes b = resident_weight_bytes(m);
  if (b.quantized == 0) return;
  std::printf("weights: %.3f MB resident on rank 0 (%.3f MB quantized, %.3f MB unquantized)\n",
              b.total() / 1e6, b.quantized / 1e6, b.dense / 1e6);
}

// The traced decoder: loaded from --load-trace (its config from the trace's metadata into s),
// or traced from s (and saved with --save-trace). Sim: every rank from this thread; MPI: this
// process's rank.
std::shared_ptr<trace::TensorParallelModel> traced_model(const GenerateCli& c, ModelSource& s) {
  if (!c.load_trace.empty()) {
    auto m =
        trace::parallel_model_load(c.load_trace, {.backend = c.backend, .expect_tp_degree = c.tp});
    const auto it = m->metadata().find("model_config");
    if (it == m->metadata().end())
      throw trace::TraceError(str("[nxd-generate] ", c.load_trace,
                                  " records no model_config (not saved by nxd-generate)"));
    s.cfg = ckpt::model_config_from_json(nlohmann::json::parse(it->second));
    check_model_fits(s.cfg, c, c.load_trace);
    return m;
  }
  const int64_t L = s.cfg.max_position_embeddings;
  std::vector<int64_t> buckets = c.buckets;
  if (buckets.empty())
    for (const auto& b :
         trace::BucketConfig::automatic({.min_seq = std::min<int64_t>(128, L), .max_seq = L})
             .buckets)
      buckets.push_back(b.seq);
  for (int64_t b : buckets)
    if (b > L) throw Usage(str("--buckets: ", b, " exceeds max_position_embeddings=", L));
  trace::DecoderTraceOptions o{
      .tp_degree = c.tp, .prefill_buckets = buckets, .max_len = L, .backend = c.backend};
  auto m = trace::trace_decoder(
      [&s, &c] {
        auto lm = build_model(s);
        if (c.quantize != WeightQuant::none) {
          const QuantizedLmReport q = quantize_causal_lm(*lm, {}, c.quant);
          if (current_context().rank() == 0) print_quantize_summary(q, c.quant);
        }
        if (current_context().rank() == 0) print_weight_bytes(*lm);
        return lm;
      },
      o);
  m->metadata()["model_config"] = ckpt::model_config_json(s.cfg).dump();
  if (!c.save_trace.empty()) trace::parallel_model_save(*m, c.save_trace);
  return m;
}

GenerateResult run_traced(const GenerateCli& c, ModelSource& s, const Tokens& t,
                          std::vector<int64_t>& prompt);

// What --quantize changed (printed by rank 0; every rank has the same figures).
void print_quantized(const QuantizedLmReport& r, const QuantizeOptions& o) {
  print_quantize_summary(r, o);
  std::printf(
      "quantized on the prompt (%lld tokens): max logit change %.4g (max |logit| %.4g), most "
      "likely next token unchanged at %lld/%lld positions",
      (long long)r.positions, r.max_logit_change, r.max_abs_logit, (long long)r.argmax_agree,
      (long long)r.positions);
  if (r.positions > 1)
    std::printf(", prompt perplexity %.4f -> %.4f", r.perplexity_before, r.perplexity_after);
  std::printf("\n");
}

// What speculative decoding did (printed by rank 0).
void print_speculative(const GenerateCli& c, const SpeculativeResult& r, int64_t prompt_len) {
  const int64_t generated = static_cast<int64_t>(r.sequence.size()) - prompt_len;
  std::printf(
      "speculative: k=%lld, %lld verification steps, %lld of %lld proposed tokens accepted "
      "(%.1f%%), %.2f tokens per step, %lld draft steps (the decode line includes the prefill)\n",
      (long long)c.speculate, (long long)r.rounds, (long long)r.accepted, (long long)r.proposed,
      100.0 * r.acceptance_rate(), r.rounds ? double(generated - 1) / double(r.rounds) : 0.0,
      (long long)r.draft_steps);
}

// The eager path: generate_batch with the KV cache, or speculative decoding with a draft.
GenerateResult run_eager(const GenerateCli& c, CausalLM& m, const std::vector<int64_t>& prompt,
                         CausalLM* draft = nullptr) {
  if (c.quantize != WeightQuant::none) {
    const QuantizedLmReport q = quantize_causal_lm(m, prompt, c.quant);
    if (current_context().rank() == 0) print_quantized(q, c.quant);
  }
  if (current_context().rank() == 0) print_weight_bytes(m);
  if (!draft) return m.generate_batch({prompt}, c.gen);
  const SpeculativeResult s = speculative_generate(m, *draft, prompt, c.gen, {.k = c.speculate});
  if (current_context().rank() == 0) print_speculative(c, s, static_cast<int64_t>(prompt.size()));
  GenerateResult r;  // the whole generation counts as decode (the prefill is inside it)
  r.sequences = {s.sequence};
  r.stop_reasons = {s.stop};
  r.decode_tokens = static_cast<int64_t>(s.sequence.size() - prompt.size());
  r.decode_steps = s.rounds;
  r.decode_seconds = s.seconds;
  return r;
}

void print_report(const GenerateCli& c, const ModelSource& s, const Tokens& t,
                  const GenerateResult& r, int64_t prompt_len) {
  const std::vector<int64_t>& seq = r.sequences.at(0);
  std::string text;
  int64_t left_out = 0;
  if (t.tok)
    text = t.tok->decode_model_output(seq, left_out);
  else
    for (int64_t id : seq) text.push_back(id < 256 ? static_cast<char>(id) : '?');
  std::fwrite(text.data(), 1, text.size(), stdout);  // every byte, NULs too
  std::printf("\n");
  std::printf("tokens:");
  for (int64_t id : seq) std::printf(" %lld", (long long)id);
  std::printf("\n");
  std::printf("tokenizer: %s\n", t.line.c_str());
  if (left_out > 0)
    std::printf(
        "text: %lld generated id(s) >= the tokenizer's %lld left out (model vocab_size=%lld)\n",
        (long long)left_out, (long long)t.tok->vocab_size(), (long long)s.cfg.vocab_size);
  const int64_t generated = static_cast<int64_t>(seq.size()) - prompt_len;
  if (r.prefill_tokens > 0)  // speculative decoding counts its prefill inside the decode line
    std::printf("prefill: %lld tokens in %.3f ms, %.1f tokens/s\n", (long long)r.prefill_tokens,
                r.prefill_seconds * 1e3, r.prefill_tokens / std::max(r.prefill_seconds, 1e-12));
  std::printf("decode: %lld tokens in %.3f ms, %.1f tokens/s\n", (long long)r.decode_tokens,
              r.decode_seconds * 1e3,
              r.decode_tokens > 0 ? r.decode_tokens / std::max(r.decode_seconds, 1e-12) : 0.0);
  InferenceModelOptions io;
  io.tp = c.tp;
  io.instance = c.instance;
  io.prompt_tokens = prompt_len;
  io.new_tokens = std::max<int64_t>(1, generated);
  const InferenceEstimate e = estimate_inference(s.cfg, io);
  std::printf(
      "modeled on %s at TP %d: time to first token %.3f ms, time per output token %.3f ms "
      "(%.3f ms per output token end to end)\n",
      e.machine.c_str(), c.tp, e.ttft * 1e3, e.tpot * 1e3, e.e2e_per_token * 1e3);
  if (e.padding.needed())
    std::printf("modeled with the sizes padded for TP %d as the Neuron libraries pad: %s\n", c.tp,
                e.padding.describe().c_str());
  if (r.stop_reasons.at(0) == "max_position_embeddings")
    std::printf(
        "stopped: the sequence reached max_position_embeddings=%lld before "
        "--max-new-tokens\n",
        (long long)s.cfg.max_position_embeddings);
}

// The ids of `text`: the tokenizer's, or its bytes.
std::vector<int64_t> text_ids(const std::string& text, const ModelSource& s, const Tokens& t) {
  std::vector<int64_t> ids;
  if (t.tok) {
    if (t.tok->vocab_size() > s.cfg.vocab_size)
      throw ConfigError(str("[nxd-generate] the tokenizer ", t.tok->path(), " has ",
                            t.tok->vocab_size(), " ids but the model's vocab_size is ",
                            s.cfg.vocab_size));
    ids = t.tok->encode(text);
  } else {
    if (s.cfg.vocab_size < 256)
      throw ConfigError(
          str("[nxd-generate] byte-level prompts need vocab_size >= 256, the model "
              "has ",
              s.cfg.vocab_size, " (give a --tokenizer)"));
    for (unsigned char ch : text) ids.push_back(ch);
  }
  return ids;
}

std::vector<int64_t> prompt_ids(const GenerateCli& c, const ModelSource& s, const Tokens& t) {
  const std::vector<int64_t> ids = text_ids(c.prompt, s, t);
  if (static_cast<int64_t>(ids.size()) > s.cfg.max_position_embeddings)
    throw Usage(str("--prompt has ", ids.size(),
                    " tokens, more than the model's "
                    "max_position_embeddings=",
                    s.cfg.max_position_embeddings));
  return ids;
}

// A GGUF file's q8_0 / q4_0 output head is kept quantized (ckpt::gguf_quantized_head).
void print_gguf_head(const GenerateCli& c, const ModelSource& s) {
  if (s.head && (c.backend == "sim" || cli::launcher_rank() == 0))
    std::printf("output head: %s (the GGUF file's quantized output tensor, kept quantized)\n",
                weight_quant_name(s.head->opts.head));
}

GenerateResult run_traced(const GenerateCli& c, ModelSource& s, const Tokens& t,
                          std::vector<int64_t>& prompt) {
  if (c.load_trace.empty()) s = resolve_source(c);
  print_gguf_head(c, s);
  auto m = traced_model(c, s);
  prompt = prompt_ids(c, s, t);
  return trace::traced_generate(*m, {prompt}, c.gen);
}

int run(int argc, char** argv) {
  const GenerateCli c = parse_args(argc, argv);
  io::check_environment();  // NXD_* variables, as nxd-train checks them
  const Tokens t = load_tokens(c);
  if (!c.quality_report.empty()) {
    const ModelSource s = resolve_source(c);
    if (c.window > s.cfg.max_position_embeddings)
      throw Usage(str("--window ", c.window,
                      " exceeds max_position_embeddings=", s.cfg.max_position_embeddings));
    const std::string text = io::read_regular_file(c.quality_report, "--quality-report",
                                                   int64_t{1} << 30, "nxd-generate");
    tools::QualityOptions qo{.window = c.window, .tp = c.tp, .instance = c.instance};
    if (c.quantize == WeightQuant::int4) qo.int4 = c.quant;
    tools::print_quality_report(tools::quality_report(s, text_ids(text, s, t), qo),
                                c.quality_report);
    return 0;
  }
  if (!c.eager && c.backend == "sim") {
    ModelSource s;
    std::vector<int64_t> prompt;
    GenerateResult r = run_traced(c, s, t, prompt);
    print_report(c, s, t, r, static_cast<int64_t>(prompt.size()));
    return 0;
  }
  ModelSource s, ds;  // ds: the draft's, with --draft-model
  std::vector<int64_t> prompt;
  if (c.eager) {
    s = resolve_source(c);
    if (!c.draft_model.empty()) ds = resolve_draft(c, s);
    prompt = prompt_ids(c, s, t);
    print_gguf_head(c, s);
    if (s.quantized && (c.backend == "sim" || cli::launcher_rank() == 0))
      std::printf("quantized checkpoint: %s weights in %zu linear layers (%s)\n",
                  describe(s.quantized->opts).c_str(), s.quantized->layers.size(),
                  s.quantized->file.string().c_str());
  }
  if (c.backend == "sim") {
    GenerateResult res;
    std::mutex mu;
    sim::LaunchOptions lo;
    lo.world_size = c.tp;
    lo.instance = c.instance;
    sim::launch(lo, [&] {
      auto m = load_model(c, s);
      auto d = c.draft_model.empty() ? nullptr : build_model(ds);
      GenerateResult r = run_eager(c, *m, prompt, d.get());
      std::lock_guard g(mu);
      if (current_context().rank() == 0) res = std::move(r);
    });
    print_report(c, s, t, res, static_cast<int64_t>(prompt.size()));
    return 0;
  }
  if (!mpi::available())
    throw ConfigError(
        "[nxd-generate] --backend mpi but nxd was built without MPI (NXD_WITH_MPI=OFF)");
  mpi::Session session(&argc, &argv);
  if (session.size() != c.tp) {
    if (session.rank() == 0)
      std::fprintf(stderr, "nxd-generate: error: --tp %d but mpirun started %d process(es)\n", c.tp,
                   session.size());
    world().barrier();
    return session.rank() == 0 ? 2 : 0;
  }
  GenerateResult r;
  if (c.eager) {
    auto m = load_model(c, s);
    auto d = c.draft_model.empty() ? nullptr : build_model(ds);
    r = run_eager(c, *m, prompt, d.get());
  } else {
    parallel_state::initialize_model_parallel(c.tp);
    r = run_traced(c, s, t, prompt);
  }
  if (session.rank() == 0) print_report(c, s, t, r, static_cast<int64_t>(prompt.size()));
  std::fflush(stdout);
  world().barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quiet = cli::launcher_rank() != 0;
  return cli::run_main("nxd-generate",
                       [&] {
                         try {
                           return run(argc, argv);
                         } catch (const Usage& e) {
                           if (!quiet)
                             std::fprintf(stderr, "%s%s%s",
                                          *e.what() ? "nxd-generate: error: " : "", e.what(),
                                          *e.what() ? "\n" : "");
                           if (!quiet) std::fputs(kUsage, stderr);
                           return quiet ? 0 : (*e.what() ? 2 : 0);
                         }
                       },
                       {.quiet = quiet});
}
