// nxd-generate's command line: see generate_cli.h.
#include "generate_cli.h"

#include <cstdlib>

#include "nxd/checkpoint/quantized.h"
#include "nxd/runtime/sim/machine.h"

namespace nxd::generate_cli {

const char* const kUsage =
    "usage: nxd-generate (--checkpoint DIR | --hf DIR | --gguf FILE) --prompt TEXT\n"
    "                    [--max-new-tokens N]\n"
    "                    [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tp N]\n"
    "                    [--backend sim|mpi] [--eager] [--instance TYPE] [--buckets N,N,...]\n"
    "                    [--save-trace DIR] [--load-trace DIR] [--tokenizer PATH|bytes]\n"
    "                    [--lora DIR] [--quantize int8|int4[:G][:asym][:q8][:head[=int8|int4]]]\n"
    "                    [--draft-model DIR [--speculate K]]\n"
    "       nxd-generate (--checkpoint DIR | --hf DIR | --gguf FILE) --quality-report TEXT\n"
    "                    [--window N] [--quantize int4[:G][:asym][:q8][:head=int4]] [--tp N]\n"
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
    "                    trn1.32xlarge|trn2.48xlarge|trn2u.48xlarge|trn2u|trn3-gen1|trn3-gen2\n"
    "                    (Trainium2 and Trainium3 at LNC=2; TYPE:lnc=1 for LNC=1) (default:\n"
    "                    the smallest inf2 with --tp NeuronCores)\n";

namespace {

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
        "(int4[:32|:64|:128][:asym][:q8]), got int8");
  if (!c.checkpoint.empty() && ckpt::is_quantized_checkpoint(c.checkpoint))
    throw Usage(str("--quality-report needs unquantized weights: --checkpoint ", c.checkpoint,
                    " is a quantized checkpoint"));
}

}  // namespace

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

}  // namespace nxd::generate_cli
