// nxd-generate: text from a trained (nxd checkpoint) or imported (transformers folder) causal LM
// with the KV cache, at TP 1..8 on the sim backend or under mpirun, and the modeled latency of
// the same generation on a Neuron instance.
//   nxd-generate (--checkpoint DIR | --hf DIR | --gguf FILE) --prompt TEXT [--max-new-tokens N]
//                [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tp N]
//                [--backend sim|mpi] [--eager] [--instance TYPE] [--buckets N,N,...]
//                [--save-trace DIR] [--load-trace DIR] [--tokenizer PATH|bytes]
//                [--quantize int8|int4[:G][:asym][:head[=int8|int4]]]
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

const char* kUsage =
    "usage: nxd-generate (--checkpoint DIR | --hf DIR | --gguf FILE) --prompt TEXT\n"
    "                    [--max-new-tokens N]\n"
    "                    [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tp N]\n"
    "                    [--backend sim|mpi] [--eager] [--instance TYPE] [--buckets N,N,...]\n"
    "                    [--save-trace DIR] [--load-trace DIR] [--tokenizer PATH|bytes]\n"
    "                    [--lora DIR] [--quantize int8|int4[:G][:asym][:head[=int8|int4]]]\n"
    "                    [--draft-model DIR [--speculate K]]\n"
    "       nxd-generate (--checkpoint DIR | --hf DIR | --gguf FILE) --quality-report TEXT\n"
    "                    [--window N] [--quantize int4[:G][:asym][:head=int4]] [--tp N]\n"
    "                    [--tokenizer ...]\n"
    "  --checkpoint DIR  an nxd checkpoint (DIR/<tag> or a folder of them: the newest complete)\n"
    "  --hf DIR          a transformers Llama / GPT-NeoX folder (config.json, model.safetensors)\n"
    "  --gguf FILE       a Llama GGUF file (llama.cpp's; f32/f16/bf16/q8_0/q4_0 tensors, read as\n"
    "                    f32 but a q4_0/q8_0 output head kept int4/int8; its tokenizer is not\n"
    "                    read: --tokenizer)\n"
    "  --lora DIR        a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors)\n"
    "                    merged into the weights before generating (a LoRA checkpoint's own\n"
    "                    adapters are always merged)\n"
    "  --draft-model DIR speculative decoding (with --eager): a smaller model with the same\n"
    "                    vocabulary (nxd checkpoint, transformers folder or GGUF file) proposes\n"
    "                    --speculate\n"
    "                    K tokens (1..64, default 4) per step of the model\n"
    "  --quality-report TEXT  perplexity of the text file for fp32, bf16, int8 and int4 weights\n"
    "                    (each also with an int8 output head) and the largest logit change\n"
    "                    against fp32 (windows of --window tokens,\n"
    "                    default max_position_embeddings, as nxd-train cuts a corpus)\n"
    "  --temperature 0 is greedy (the default); --top-k 0 and --top-p 1 keep every token\n"
    "  --eager           the eager KV-cache path (the reference; default: the traced model)\n"
    "  --buckets         prompt-length buckets of the traced prefill (default: powers of two\n"
    "                    from 128 up to max_position_embeddings)\n"
    "  --save-trace DIR  save the traced model there (a new or empty folder)\n"
    "  --load-trace DIR  run a saved traced model (no --checkpoint/--hf needed)\n"
    "  --tokenizer PATH  a transformers tokenizer.json (byte-level BPE) for the prompt and the\n"
    "                    text (default: --hf DIR's tokenizer.json if any, else bytes; 'bytes':\n"
    "                    the prompt's bytes are its ids)\n"
    "  --instance        inf2.xlarge|inf2.8xlarge|inf2.24xlarge|inf2.48xlarge|trn1.2xlarge|\n"
    "                    trn1.32xlarge|trn2.48xlarge|trn2u.48xlarge|trn2u (Trainium2 at LNC=2;\n"
    "                    TYPE:lnc=1 for LNC=1) (default: the smallest inf2 with --tp "
    "NeuronCores)\n";

struct Usage : UserError {
  using UserError::UserError;
};

// Everything the command line says.
struct GenerateCli {
  std::string checkpoint, hf, gguf, prompt;
  std::string lora;  // --lora: a PEFT adapter folder
  bool has_prompt = false;
  GenerateOptions gen{.max_new_tokens = 32, .temperature = 0.0};
  int tp = 1;
  std::string backend = "sim";
  bool eager = false;
  WeightQuant quantize = WeightQuant::none;  // --quantize: eager only
  QuantizeOptions quant;                     // its format's options
  std::string instance;                      // empty: the smallest inf2 with tp cores
  std::vector<int64_t> buckets;
  std::string save_trace, load_trace;
  std::string tokenizer;       // a tokenizer.json, "bytes", or empty (the default)
  std::string quality_report;  // --quality-report FILE: perplexities, no generation
  int64_t window = 0;          // --window: its window (0: max_position_embeddings)
  std::string draft_model;     // --draft-model: speculative decoding's draft (eager only)
  int64_t speculate = 0;       // --speculate: tokens proposed per round (0: 4 with a draft)
};

int64_t to_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi);

std::vector<int64_t> parse_buckets(const std::string& v) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at <= v.size()) {
    const size_t comma = std::min(v.find(',', at), v.size());
    out.push_back(to_int("--buckets", v.substr(at, comma - at), 1, 1 << 24));
    at = comma + 1;
  }
  return out;
}

int64_t to_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || x < lo || x > hi)
    throw Usage(str(flag, " needs an integer in [", lo, ", ", hi, "], got '", v, "'"));
  return x;
}

double to_double(const std::string& flag, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || !(x >= lo && x <= hi))
    throw Usage(str(flag, " needs a number in [", lo, ", ", hi, "], got '", v, "'"));
  return x;
}

// --quality-report runs the model four ways on a text (tools/generate_quality.h): eager, sim, from
// unquantized weights; --quantize only picks its int4 form.
void check_quality_flags(const GenerateCli& c) {
  if (c.has_prompt || !c.load_trace.empty() || !c.save_trace.empty() || !c.buckets.empty() ||
      !c.draft_model.empty())
    throw Usage(
        "--quality-report FILE evaluates the model on FILE: it takes no --prompt, "
        "--load-trace, --save-trace, --buckets or --draft-model");
  if (c.backend != "sim") throw Usage("--quality-report runs on --backend sim");
  if (c.quantize == WeightQuant::int8)
    throw Usage(
        "--quality-report reports int8 and int4 both: --quantize picks its int4 form "
        "(int4[:32|:64|:128][:asym]), got int8");
  if (!c.checkpoint.empty() && ckpt::is_quantized_checkpoint(c.checkpoint))
    throw Usage(str("--quality-report needs unquantized weights: --checkpoint ", c.checkpoint,
                    " is a quantized checkpoint"));
}

GenerateCli parse_args(int argc, char** argv) {
  GenerateCli c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") throw Usage("");
    if (a == "--eager") {
      c.eager = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) throw Usage(str("unexpected argument '", a, "'"));
    if (i + 1 >= argc) throw Usage(str(a, " needs a value"));
    const std::string v = argv[++i];
    if (a == "--checkpoint")
      c.checkpoint = v;
    else if (a == "--hf")
      c.hf = v;
    else if (a == "--gguf")
      c.gguf = v;
    else if (a == "--lora")
      c.lora = v;
    else if (a == "--prompt")
      c.prompt = v, c.has_prompt = true;
    else if (a == "--max-new-tokens")
      c.gen.max_new_tokens = to_int(a, v, 0, 1 << 20);
    else if (a == "--temperature")
      c.gen.temperature = to_double(a, v, 0, 1e6);
    else if (a == "--top-k")
      c.gen.top_k = to_int(a, v, 0, int64_t{1} << 40);
    else if (a == "--top-p")
      c.gen.top_p = to_double(a, v, 1e-9, 1);
    else if (a == "--seed")
      c.gen.seed = static_cast<uint64_t>(to_int(a, v, 0, INT64_MAX));
    else if (a == "--tp")
      c.tp = static_cast<int>(to_int(a, v, 1, 64));
    else if (a == "--backend")
      c.backend = v;
    else if (a == "--instance")
      c.instance = v;
    else if (a == "--buckets")
      c.buckets = parse_buckets(v);
    else if (a == "--save-trace")
      c.save_trace = v;
    else if (a == "--load-trace")
      c.load_trace = v;
    else if (a == "--tokenizer")
      c.tokenizer = v;
    else if (a == "--draft-model")
      c.draft_model = v;
    else if (a == "--quality-report")
      c.quality_report = v;
    else if (a == "--window")
      c.window = to_int(a, v, 1, 1 << 24);
    else if (a == "--speculate")
      c.speculate = to_int(a, v, 1, 64);
    else if (a == "--quantize")
      try {
        c.quant = parse_weight_quant(v);
        c.quantize = c.quant.format;
      } catch (const ConfigError& e) {
        throw Usage(str("--quantize: ", e.what()));
      }
    else
      throw Usage(str("unknown flag '", a, "'"));
  }
  if (c.window > 0 && c.quality_report.empty())
    throw Usage("--window is an option of --quality-report");
  if (!c.quality_report.empty()) check_quality_flags(c);
  if (!c.load_trace.empty()) {
    if (!c.checkpoint.empty() || !c.hf.empty() || !c.gguf.empty() || c.eager ||
        !c.save_trace.empty() || !c.buckets.empty() || !c.lora.empty())
      throw Usage(
          "--load-trace runs a saved trace: it takes no --checkpoint, --hf, --eager, "
          "--save-trace, --buckets or --lora");
  } else if (!c.checkpoint.empty() + !c.hf.empty() + !c.gguf.empty() != 1) {
    throw Usage("give one of --checkpoint DIR, --hf DIR or --gguf FILE (or --load-trace DIR)");
  }
  if (c.eager && (!c.save_trace.empty() || !c.buckets.empty()))
    throw Usage("--save-trace and --buckets apply to the traced path, not --eager");
  if (c.speculate > 0 && c.draft_model.empty())
    throw Usage("--speculate K needs --draft-model DIR");
  if (!c.draft_model.empty() && !c.eager)
    throw Usage(
        "--draft-model runs on the eager path only (add --eager; the traced decoder has no "
        "verification graph)");
  if (!c.draft_model.empty() && c.speculate == 0) c.speculate = 4;
  if (c.quality_report.empty() && (!c.has_prompt || c.prompt.empty()))
    throw Usage("--prompt TEXT is required (not empty)");
  if (c.backend != "sim" && c.backend != "mpi")
    throw Usage(str("--backend must be sim or mpi, got '", c.backend, "'"));
  if (c.instance.empty())
    c.instance = c.tp <= 2    ? "inf2.xlarge"
                 : c.tp <= 12 ? "inf2.24xlarge"
                 : c.tp <= 24 ? "inf2.48xlarge"
                              : "trn1.32xlarge";
  int cores = 0;
  try {
    cores = sim::machine(c.instance).world_size();  // names the known types when unknown
  } catch (const ConfigError& e) {
    throw Usage(str("--instance: ", e.what()));
  }
  if (c.tp > cores)
    throw Usage(str("--tp ", c.tp, " exceeds the ", cores, " NeuronCores of ", c.instance));
  return c;
}

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
