// What nxd-train prints and writes about a run on its logging rank (run_report.h).
#include "nxd/train_app/run_report.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nxd/runtime/allocator.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/cpu_info.h"

namespace fs = std::filesystem;

namespace nxd::train_app {

namespace {

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3)
    s.insert(static_cast<size_t>(i), 1, ',');
  return s;
}

// Prints what the run is about to do (data, model, layout, schedule) once setup is done.
std::string format_percent(int64_t part, int64_t whole) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f%%",
                whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return b;
}

class RunSummary : public trainer::Callback {
 public:
  RunSummary(const TrainConfig& cfg, const TrainData& data) : cfg_(cfg), data_(data) {}
  void on_fit_start(trainer::Trainer& t, trainer::TrainingModule& module) override {
    const auto& m = cfg_.model;
    const int world = current_context().world_size();
    const int64_t tp = cfg_.dist.tensor_model_parallel_size;
    const auto& na = cfg_.resolved.not_applicable();
    if (!na.empty()) {
      std::string keys;
      for (const auto& k : na) keys += (keys.empty() ? "" : ", ") + k;
      t.message(str("not applicable in nxd (accepted and ignored): ", keys));
    }
    t.message("data: " + data_.description);
    for (const auto& n : data_.notes) t.message("data: " + n);
    if (!data_.skipped.empty()) t.message("data: " + summarize_skipped(data_.skipped));
    t.message(str("model: ", m.arch, ", ", m.num_layers, " layers, hidden ", m.hidden_size, ", ",
                  m.num_attention_heads, " heads (", m.num_kv_heads, " kv), ffn ",
                  m.ffn_hidden_size,
                  m.moe.num_experts > 0
                      ? str(" in ", m.moe.num_experts, " experts (top ", m.moe.top_k,
                            m.moe.frequency == 1 ? std::string(", every layer)")
                                                 : str(", every ", m.moe.frequency, " layers)"))
                      : std::string(),
                  ", vocab ", m.vocab_size, ": ", with_commas(t.num_parameters()), " parameters"));
    if (const auto& l = cfg_.lora)
      t.message(str("lora: rank ", l->lora_rank, ", alpha ", l->lora_alpha, ", dropout ",
                    l->lora_dropout, ": trainable ", with_commas(t.num_trainable_parameters()),
                    " of ", with_commas(t.num_parameters()), " parameters (",
                    format_percent(t.num_trainable_parameters(), t.num_parameters()),
                    "), the rest frozen"));
    if (world > 1)
      t.message(
          str("parallel: ", world, " rank(s) on ",
              cfg_.dist.backend == "sim" ? "the sim backend (" + cfg_.dist.instance + ")"
                                         : std::string("MPI"),
              ": tensor parallel ", tp,
              cfg_.dist.sequence_parallel && tp > 1 ? " with sequence parallelism" : "",
              pipeline_text(module),
              cfg_.dist.context_parallel_size > 1
                  ? str(", context parallel ", cfg_.dist.context_parallel_size)
                  : std::string(),
              ", data parallel ", t.dp_size(),
              cfg_.dist.zero1() ? str(" with ZeRO-", optim::zero_stage_name(cfg_.dist.zero_stage))
                                : std::string(),
              cfg_.dist.expert_model_parallel_size > 1
                  ? str(" (experts split over ", cfg_.dist.expert_model_parallel_size, " of them)")
                  : std::string(),
              cfg_.dist.kv_replicator > 1 ? str(", kv replicator ", cfg_.dist.kv_replicator)
                                          : std::string()));
    if (const pipeline::PipelineModel* p = module.pipeline()) {
      std::istringstream lines(p->balance_report());
      for (std::string line; std::getline(lines, line);) t.message("pipeline: " + line);
      t.message(str("pipeline: this rank (last stage) holds ",
                    with_commas(p->local_parameter_bytes()), " bytes of parameter tensors"));
    }
    init_text(t, module);
    const auto& o = cfg_.optim;
    if (cfg_.trainer.max_steps == 0) {
      t.message(
          str("eval: no training (trainer.max_steps=0): the validation loss over the whole "
              "validation split, micro batch ",
              cfg_.data.micro_batch_size, "; output in ", cfg_.out_dir));
      return;
    }
    t.message(str("train: ", cfg_.trainer.max_steps, " steps of ", cfg_.data.global_batch_size,
                  " x ", cfg_.data.seq_length, " tokens (micro batch ", cfg_.data.micro_batch_size,
                  ", ", cfg_.grad_accum_steps, " accumulation step(s)), ", o.name, " lr ", o.lr,
                  " ", o.sched_name, ", ",
                  world > 1 && cfg_.dist.backend == "sim"
                      ? str(world, " rank threads")
                      : str(cfg_.trainer.num_threads, " thread(s)"),
                  ", precision ", precision_text(), "; output in ", cfg_.out_dir));
    t.message(str("cpu: ", cpu::describe()));
  }
  // model.init_from: where the weights came from (or that a resume replaced them)
  void init_text(trainer::Trainer& t, trainer::TrainingModule& module) const {
    if (cfg_.init.path.empty()) return;
    if (t.global_step() > 0) {
      t.message(str("init: model.init_from not used: resumed at step ", t.global_step()));
      return;
    }
    t.message(str("init: weights from ", cfg_.init.description, ", resharded to tp ",
                  cfg_.dist.tensor_model_parallel_size, " pp ",
                  cfg_.dist.pipeline_model_parallel_size, " dp ", t.dp_size(),
                  "; fresh optimizer at step 0"));
    if (auto* lm = dynamic_cast<CausalLMModule*>(&module))
      for (const auto& n : lm->init_notes()) t.message("init: " + n);
  }
  // "mixed_precision (bf16 parameters, f32 master weights, f32 gradients, bf16 matmuls (amx))"
  std::string precision_text() const {
    const api::ResolvedPrecision rp = api::resolve_precision(nxd_config_of(cfg_));
    std::string what;
    auto add = [&](const std::string& s) { what += (what.empty() ? "" : ", ") + s; };
    if (rp.param_dtype == DType::bf16) add("bf16 parameters");
    if (rp.master_weights) add("f32 master weights");
    if (rp.param_dtype == DType::bf16) add(rp.fp32_grad_acc ? "f32 gradients" : "bf16 gradients");
    if (rp.stochastic_rounding) add("stochastic rounding");
    if (rp.matmul == blas::MatmulPrecision::bf16 || rp.param_dtype == DType::bf16)
      add(str("bf16 matmuls (", blas::bf16_kernel_name(blas::bf16_kernel()),
              blas::bf16_kernel() == blas::Bf16Kernel::portable
                  ? ": this CPU has no bf16 instructions; inputs rounded to bf16, f32 engine"
                  : "",
              ")"));
    return cfg_.precision.type + (what.empty() ? "" : " (" + what + ")");
  }
  // ", pipeline parallel 2 (1f1b, 4 microbatches)" and the partition, or "".
  std::string pipeline_text(trainer::TrainingModule& module) const {
    const pipeline::PipelineModel* p = module.pipeline();
    if (!p) return "";
    const pipeline::ScheduleConfig& s = p->schedule();
    return str(", pipeline parallel ", s.pp, " (", pipeline::schedule_name(s.kind), ", ",
               s.num_microbatches, " microbatches",
               s.vpp > 1 ? str(", ", s.vpp, " virtual stages per rank") : std::string(), ")");
  }
  void on_validation_end(trainer::Trainer& t, trainer::TrainingModule&, int64_t step,
                         double v) override {
    if (cfg_.trainer.max_steps == 0)
      t.message(str("eval at step ", step, ": val_loss ", v, ", perplexity ", std::exp(v)));
    else if (step == 0)
      t.message(str("step 0: val_loss ", v));
  }

 private:
  const TrainConfig& cfg_;
  const TrainData& data_;
};

void print_result(const TrainConfig& cfg, const trainer::FitResult& fr, std::FILE* out) {
  // this fit's steps and time only (after a resume: since the checkpoint's step); no loss
  // without a step
  std::fprintf(out, "done: %lld steps%s in %s (setup %.1f s)", static_cast<long long>(fr.steps),
               fr.start_step > 0 ? str(" (resumed at step ", fr.start_step, ", now at ",
                                       fr.start_step + fr.steps, ")")
                                       .c_str()
                                 : "",
               trainer::format_duration(fr.seconds).c_str(), fr.setup_seconds);
  if (fr.steps > 0) std::fprintf(out, ", %.0f tokens/s, loss %.4f", fr.tokens_per_s, fr.last_loss);
  if (fr.steps == 0 && fr.initial_val_loss)
    std::fprintf(out, ", val_loss %.6f, perplexity %.4f", *fr.initial_val_loss,
                 std::exp(*fr.initial_val_loss));
  if (fr.sim_step_seconds > 0 && fr.steps > 0)
    std::fprintf(
        out, "; modeled on %s: %.2f ms/step (%.0f tokens/s), HBM peak %.1f MiB per NeuronCore",
        cfg.dist.instance.c_str(), fr.sim_step_seconds * 1e3,
        static_cast<double>(cfg.data.global_batch_size * cfg.data.seq_length) / fr.sim_step_seconds,
        static_cast<double>(fr.hbm_peak_bytes) / (1 << 20));
  if (fr.final_val_loss)
    std::fprintf(out, ", val_loss %.4f (from %.4f)", *fr.final_val_loss,
                 fr.initial_val_loss.value_or(0.0));
  std::fprintf(out, "\n");
  if (fr.activation_peak_bytes > 0)
    std::fprintf(out,
                 "memory (allocator, the largest rank): activation peak %.2f MiB (peak above the "
                 "resident parameters, gradients and optimizer state), optimizer state %.2f MiB\n",
                 static_cast<double>(fr.activation_peak_bytes) / (1 << 20),
                 static_cast<double>(fr.optimizer_state_bytes) / (1 << 20));
  if (fr.sim_bubble >= 0) {
    pipeline::ScheduleConfig s;
    s.pp = static_cast<int>(cfg.dist.pipeline_model_parallel_size);
    s.vpp = static_cast<int>(cfg.dist.virtual_pipeline_model_parallel_size);
    s.num_microbatches = static_cast<int>(cfg.grad_accum_steps);
    s.kind = cfg.dist.pipeline_schedule;
    std::fprintf(out,
                 "pipeline: modeled bubble %.3f of the schedule (mean over ranks of the time "
                 "outside forwards and backwards); analytical (pp-1)/(m+pp-1)%s = %.3f\n",
                 fr.sim_bubble, s.vpp > 1 ? "/vpp" : "", pipeline::analytical_bubble(s));
  }
  if (!fr.stop_reason.empty()) std::fprintf(out, "stopped: %s\n", fr.stop_reason.c_str());
}

// The sample: the prompt and up to generation.max_new_tokens more, every token seeing the whole
// sequence from position 0 (no sliding window): it stops where the model's context
// (max_position_embeddings) is full, and `note` says so.
std::string generate_sample(const TrainConfig& cfg, CausalLM& lm, const io::Tokenizer* tok,
                            std::string& note) {
  const auto& g = cfg.generation;
  std::vector<int64_t> prompt;
  if (tok)
    prompt = tok->encode(g.prompt);
  else
    for (unsigned char ch : g.prompt) prompt.push_back(ch);
  const int64_t ctx = cfg.model.max_position_embeddings;
  const int64_t room = ctx - static_cast<int64_t>(prompt.size());
  if (room <= 0) {
    note = str("none: the prompt's ", prompt.size(),
               " tokens fill the model's context (max_position_embeddings=", ctx, ")");
    return "";
  }
  GenerateOptions go;
  go.max_new_tokens = std::min(g.max_new_tokens, room);
  if (go.max_new_tokens < g.max_new_tokens)
    note =
        str("stopped after ", go.max_new_tokens, " of generation.max_new_tokens=", g.max_new_tokens,
            " new tokens: the model's context (max_position_embeddings=", ctx, ") is full");
  go.temperature = g.temperature;
  go.top_k = g.top_k;
  go.seed = cfg.seed;
  std::string sample;
  const std::vector<int64_t> ids = lm.generate(prompt, go);
  if (tok) {  // ids the model's padded vocabulary has but the tokenizer not: left out, said so
    int64_t left_out = 0;
    std::string text = tok->decode_model_output(ids, left_out);
    if (left_out > 0)
      note += str(note.empty() ? "" : "; ", left_out, " generated id(s) >= the tokenizer's ",
                  tok->vocab_size(), " left out");
    return text;
  }
  for (int64_t id : ids) sample.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  return sample;
}

// `s` for a terminal, every byte of it: valid UTF-8, newlines and tabs as they are, other
// control bytes and bytes that are not UTF-8 as \xNN (a backslash as \\).
std::string printable_bytes(const std::string& s) {
  std::string out;
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  auto hex = [&](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    out += buf;
  };
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    if (c == '\\') {
      out += "\\\\";
      ++i;
    } else if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f)) {
      out += static_cast<char>(c);
      ++i;
    } else if (c < 0x80) {
      hex(c);
      ++i;
    } else {
      const size_t len = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
      bool ok = len > 0 && i + len <= n && len <= 4;
      for (size_t k = 1; ok && k < len; ++k) ok = (b[i + k] & 0xc0) == 0x80;
      if (ok && len == 3) {  // no overlongs or surrogates
        const unsigned v = ((c & 0x0fu) << 6) | (b[i + 1] & 0x3fu);
        ok = v >= 0x20 && !(v >= 0x360 && v < 0x380);
      }
      if (ok && len == 4) {
        const unsigned v = ((c & 0x07u) << 6) | (b[i + 1] & 0x3fu);
        ok = v >= 0x10 && v < 0x110;
      }
      if (ok) {
        out.append(s, i, len);
        i += len;
      } else {
        hex(c);
        ++i;
      }
    }
  }
  return out;
}

}  // namespace

std::shared_ptr<trainer::Callback> make_run_summary(const TrainConfig& cfg, const TrainData& data) {
  return std::make_shared<RunSummary>(cfg, data);
}

void print_fit_report(const TrainConfig& cfg, const TrainData& data, const TrainResult& res,
                      std::FILE* out) {
  const trainer::FitResult& fr = res;
  print_result(cfg, fr, out);
  if (cfg.dist.optimizer_offload)
    std::fprintf(out,
                 "optimizer offload: HBM peak %.2f MiB per NeuronCore, host %.2f MiB per rank "
                 "(optimizer state and master weights) of %.1f GiB host RAM\n",
                 static_cast<double>(fr.hbm_peak_bytes) / (1 << 20),
                 static_cast<double>(res.host_peak_bytes) / (1 << 20),
                 static_cast<double>(host_ram_bytes()) / (1 << 30));
  if (cfg.alignment.kind == AlignmentSection::Kind::sft && fr.steps > 0) {
    // real tokens: the examples' tokens, not the padding
    const double real = fr.tokens_per_s * data.real_token_fraction;
    std::fprintf(out, "sft: %.0f real tokens/s (%.1f%% of the %.0f tokens/s, %s)", real,
                 100 * data.real_token_fraction, fr.tokens_per_s,
                 cfg.alignment.packing ? "packing" : "padding");
    if (cfg.alignment.packing)
      std::fprintf(out,
                   "; padding (one example per row) holds %.1f%% real tokens: %.0f real "
                   "tokens/s at the same rate, packing %.2fx",
                   100 * data.padding_real_token_fraction,
                   fr.tokens_per_s * data.padding_real_token_fraction,
                   data.real_token_fraction / data.padding_real_token_fraction);
    std::fprintf(out, "\n");
  }
}

std::string run_sample(const TrainConfig& cfg, CausalLMModule& module, const TrainData& data,
                       const SampleOutput& output) {
  const auto& g = cfg.generation;
  std::string sample;
  if (g.max_new_tokens > 0 && cfg.data.kind == "text" && module.pipeline()) {
    if (output.print)
      std::fprintf(output.out,
                   "sample: none (generation needs the whole model; this run holds it in %lld "
                   "pipeline stages)\n",
                   static_cast<long long>(cfg.dist.pipeline_model_parallel_size));
  } else if (g.max_new_tokens > 0 && cfg.data.kind == "text" &&
             cfg.dist.context_parallel_size > 1) {
    if (output.print)
      std::fprintf(output.out,
                   "sample: none (generation's KV cache needs the whole sequence on a rank; this "
                   "run splits it over context_parallel_size=%lld)\n",
                   static_cast<long long>(cfg.dist.context_parallel_size));
  } else if (g.max_new_tokens > 0 && cfg.data.kind == "text") {
    std::string note;
    // ZeRO-3: each layer (and the root) gathered as the generation reaches it
    sample = generate_sample(cfg, module.lm(), data.tokenizer.get(), note);
    if (output.save)
      std::ofstream(fs::path(cfg.out_dir) / "sample.txt", std::ios::binary) << sample;
    if (output.print) {
      std::fprintf(output.out, "sample (temperature %g, top_k %lld%s):\n", g.temperature,
                   static_cast<long long>(g.top_k), note.empty() ? "" : ("; " + note).c_str());
      const std::string shown = printable_bytes(sample);
      std::fwrite(shown.data(), 1, shown.size(), output.out);
      std::fputc('\n', output.out);
    }
  }
  return sample;
}

}  // namespace nxd::train_app
