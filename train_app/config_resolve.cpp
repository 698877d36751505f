// Resolution of a Config into the typed, validated TrainConfig, one section at a time.
#include "nxd/train_app/config.h"
#include "nxd/train_app/config_resolver.h"
#include "nxd/train_app/init_from.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "nxd/io/env_check.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/config.h"
#include "nxd/pipeline/schedule.h"
#include "nxd/runtime/error.h"

namespace nxd::train_app {

ModelConfig model_config(const TrainConfig& cfg) {
  ModelConfig mc = cfg.model;
  mc.sequence_parallel = cfg.dist.sequence_parallel;
  mc.kv_size_multiplier = cfg.dist.kv_replicator;
  if (cfg.init.model) {  // what no key expresses comes from model.init_from's source
    mc.attention_head_dim = cfg.init.model->attention_head_dim;
    mc.gelu_tanh = cfg.init.model->gelu_tanh;
    mc.use_parallel_residual = cfg.init.model->use_parallel_residual;
    mc.rope_scaling = cfg.init.model->rope_scaling;
    mc.hidden_act = cfg.init.model->hidden_act;
    mc.attention_bias = cfg.init.model->attention_bias;
    mc.mlp_bias = cfg.init.model->mlp_bias;
    mc.qkv_bias = cfg.init.model->qkv_bias;
    mc.qk_norm = cfg.init.model->qk_norm;
    mc.sliding_window = cfg.init.model->sliding_window;
    mc.name_or_path = cfg.init.model->name_or_path;
  } else {  // a family trained from its keys alone: transformers' fixed parts of it
    mc.qkv_bias = mc.arch == "qwen2";
    mc.qk_norm = mc.arch == "qwen3";
    mc.sliding_window = mc.arch == "mistral" && mc.max_position_embeddings > 4096 ? 4096 : 0;
  }
  return mc;
}

namespace {

using detail::Resolver;

ExpManagerSection resolve_exp_manager(Resolver& r) {
  ExpManagerSection e;
  e.create_tensorboard_logger = r.c.get_bool("exp_manager.create_tensorboard_logger");
  e.create_early_stopping_callback = r.c.get_bool("exp_manager.create_early_stopping_callback");
  const std::string p = "exp_manager.early_stopping_callback_params.";
  e.early_stopping.monitor = r.c.get_string(p + "monitor");
  e.early_stopping.patience = r.non_negative((p + "patience").c_str());
  e.early_stopping.min_delta = r.c.get_double(p + "min_delta");
  if (!(e.early_stopping.min_delta >= 0))
    r.fail(p, "min_delta must be >= 0, got ", e.early_stopping.min_delta);
  e.early_stopping.mode = r.c.get_string(p + "mode");
  const std::string c = "exp_manager.checkpoint_callback_params.";
  auto& k = e.checkpoint;
  k.every_n_train_steps = r.non_negative((c + "every_n_train_steps").c_str());
  k.save_top_k = r.c.get_int(c + "save_top_k");
  if (k.save_top_k == 0 || k.save_top_k < -1)
    r.fail(c, "save_top_k must be -1 (keep all) or positive, got ", k.save_top_k);
  k.monitor = r.c.get_string(c + "monitor");
  if (k.monitor == "step") k.monitor.clear();  // recency (NxD Training's monitor: step)
  k.mode = r.c.get_string(c + "mode");
  k.save_last = r.c.get_bool(c + "save_last");
  k.async_save = r.c.get_bool("exp_manager.async_checkpointing");
  k.save_bf16 = r.c.get_bool("exp_manager.save_bf16");
  k.zero3_files = r.c.get_string("exp_manager.zero3_checkpoint_format") == "gathered"
                      ? ckpt::Zero3ModelFiles::gathered
                      : ckpt::Zero3ModelFiles::per_rank;
  r.derive("exp_manager.create_checkpoint_callback", k.every_n_train_steps > 0);
  e.create_checkpoint_callback = r.c.get_bool("exp_manager.create_checkpoint_callback");
  e.resume_from_checkpoint = r.c.is_null("exp_manager.resume_from_checkpoint")
                                 ? std::string()
                                 : r.c.get_string("exp_manager.resume_from_checkpoint");
  e.resume_if_exists = r.c.get_bool("exp_manager.resume_if_exists");
  return e;
}

// precision.type, or its deprecated alias trainer.matmul_precision (bf16 = autocast).
PrecisionSection resolve_precision_section(Resolver& r) {
  PrecisionSection p;
  const bool typed = !r.c.is_null("precision.type");
  const bool alias = !r.c.is_null("trainer.matmul_precision");
  const std::string from_alias =
      alias && r.c.get_string("trainer.matmul_precision") == "fp32" ? "fp32" : "autocast";
  p.type = typed ? r.c.get_string("precision.type") : alias ? from_alias : "autocast";
  if (typed && alias) {
    const bool bf16_products = p.type != "fp32";
    if (bf16_products != (from_alias == "autocast"))
      r.fail("trainer.matmul_precision=", r.c.get_string("trainer.matmul_precision"),
             " contradicts precision.type=", p.type,
             " (the alias means precision.type=", from_alias, "; set only precision.type)");
  }
  r.derive("precision.type", p.type);
  for (auto [key, field] : {std::pair{"precision.master_weights", &p.master_weights},
                            std::pair{"precision.fp32_grad_acc", &p.fp32_grad_acc}})
    if (!r.c.is_null(key)) *field = r.c.get_bool(key);
  return p;
}

TrainerSection resolve_trainer(Resolver& r) {
  TrainerSection tr;
  tr.max_steps = r.non_negative("trainer.max_steps");  // 0: evaluate only (--eval)
  tr.max_epochs = r.c.is_null("trainer.max_epochs") ? -1 : r.positive("trainer.max_epochs");
  tr.log_every_n_steps = r.positive("trainer.log_every_n_steps");
  tr.val_check_interval = r.non_negative("trainer.val_check_interval");
  tr.limit_val_batches = r.non_negative("trainer.limit_val_batches");
  tr.gradient_clip_val = r.c.get_double("trainer.gradient_clip_val");
  if (!(tr.gradient_clip_val >= 0))
    r.fail("trainer.gradient_clip_val must be >= 0, got ", tr.gradient_clip_val);
  tr.on_nonfinite = r.c.get_string("trainer.on_nonfinite");
  tr.num_threads = r.non_negative("trainer.num_threads");
  if (tr.num_threads > io::kMaxThreads)
    r.fail("trainer.num_threads=", tr.num_threads, " is more than ", io::kMaxThreads, " threads");
  if (tr.num_threads == 0) {
    const auto env = io::env_num_threads();  // ConfigError naming it when malformed
    tr.num_threads =
        env ? *env : static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
    r.c.set("trainer.num_threads", tr.num_threads, "derived");  // config.yaml records the count
  }
  return tr;
}

// Everything but micro_batch_size, which needs the data-parallel size.
DataSection resolve_data(Resolver& r) {
  DataSection d;
  d.kind = r.c.get_string("data.kind");
  d.path = r.c.get_string("data.path");
  d.token_dtype = r.c.get_string("data.token_dtype");
  d.tokenizer = r.c.is_null("data.tokenizer") ? "" : r.c.get_string("data.tokenizer");
  // NxD Training names the tokenizer's folder (data.tokenizer.type): its tokenizer.json
  if (!d.tokenizer.empty() && std::filesystem::is_directory(d.tokenizer))
    d.tokenizer = (std::filesystem::path(d.tokenizer) / "tokenizer.json").string();
  if (!d.tokenizer.empty() && d.kind != "text")
    r.fail("data.tokenizer tokenizes text: data.kind=", d.kind, " (use data.kind=text)");
  d.seq_length = r.positive("data.seq_length");
  d.global_batch_size = r.positive("data.global_batch_size");
  d.val_fraction = r.c.get_double("data.val_fraction");
  d.shuffle = r.c.get_bool("data.shuffle");
  d.random_num_samples = r.positive("data.random_num_samples");
  if (!(d.val_fraction >= 0 && d.val_fraction < 1))
    r.fail("data.val_fraction must be in [0, 1), got ", d.val_fraction);
  if (d.kind != "random" && d.path.empty()) r.fail("data.path is empty (data.kind=", d.kind, ")");
  return d;
}

ModelConfig resolve_model(Resolver& r, const DataSection& d) {
  ModelConfig m;
  m.arch = r.c.get_string("model.arch");
  m.vocab_size = r.positive("model.vocab_size");
  m.num_layers = r.positive("model.num_layers");
  m.hidden_size = r.positive("model.hidden_size");
  m.num_attention_heads = r.positive("model.num_attention_heads");
  r.derive("model.num_kv_heads", m.num_attention_heads);
  m.num_kv_heads = r.positive("model.num_kv_heads");
  if (m.hidden_size % m.num_attention_heads != 0)
    r.fail("model.num_attention_heads=", m.num_attention_heads,
           " does not divide model.hidden_size=", m.hidden_size);
  if (m.num_attention_heads % m.num_kv_heads != 0)
    r.fail("model.num_kv_heads=", m.num_kv_heads,
           " does not divide model.num_attention_heads=", m.num_attention_heads);
  if (m.arch == "gpt_neox" && m.num_kv_heads != m.num_attention_heads)
    r.fail("model.arch=gpt_neox has no grouped-query attention: model.num_kv_heads=",
           m.num_kv_heads, " must equal model.num_attention_heads=", m.num_attention_heads);
  r.derive("model.ffn_hidden_size",
           is_llama_family(m.arch) ? (8 * m.hidden_size / 3 + 255) / 256 * 256 : 4 * m.hidden_size);
  m.ffn_hidden_size = r.positive("model.ffn_hidden_size");
  r.derive("model.max_position_embeddings", d.seq_length);
  m.max_position_embeddings = r.positive("model.max_position_embeddings");
  if (d.seq_length > m.max_position_embeddings)
    r.fail("data.seq_length=", d.seq_length,
           " exceeds model.max_position_embeddings=", m.max_position_embeddings);
  m.rotary_pct = r.c.get_double("model.rotary_pct");
  if (!(m.rotary_pct >= 0 && m.rotary_pct <= 1))
    r.fail("model.rotary_pct must be in [0, 1], got ", m.rotary_pct);
  m.rope_theta = r.c.get_double("model.rope_theta");
  m.norm_eps = r.c.get_double("model.norm_eps");
  m.init_method = parse_init_method(r.c.get_string("model.init_method"));
  m.init_std = r.c.get_double("model.init_std");
  m.dropout = r.c.get_double("model.dropout");
  m.tie_word_embeddings = r.c.get_bool("model.tie_word_embeddings");
  m.activations_checkpoint_granularity = r.c.is_null("model.activations_checkpoint_granularity")
                                             ? CheckpointGranularity::none
                                             : parse_checkpoint_granularity(r.c.get_string(
                                                   "model.activations_checkpoint_granularity"));
  m.moe.num_experts = r.c.get_int("model.moe.num_experts");
  m.moe.top_k = r.c.get_int("model.moe.top_k");
  m.moe.frequency = r.c.get_int("model.moe.frequency");
  m.moe.capacity_factor = r.c.get_double("model.moe.capacity_factor");
  m.moe.dropless = r.c.get_bool("model.moe.dropless");
  m.moe.router_aux_loss_coef = r.c.get_double("model.moe.router_aux_loss_coef");
  m.moe.router_z_loss_coef = r.c.get_double("model.moe.router_z_loss_coef");
  m.moe.normalize_top_k_affinities = r.c.get_bool("model.moe.normalize_top_k_affinities");
  try {
    m.moe.validate();
  } catch (const ConfigError& e) {
    r.fail("model.moe: ", e.what());
  }
  if (m.arch == "mixtral" && !m.moe.enabled())
    r.fail("model.arch=mixtral needs model.moe.num_experts > 0");
  if (m.moe.enabled() && m.arch != "llama" && m.arch != "mixtral")
    r.fail("model.moe.num_experts=", m.moe.num_experts, " needs model.arch llama or mixtral, got ",
           m.arch);
  if (d.kind == "text" && d.tokenizer.empty() && m.vocab_size < 256)
    r.fail("model.vocab_size=", m.vocab_size,
           " is too small for byte-level text (data.kind=text needs >= 256)");
  return m;
}

OptimSection resolve_optim(Resolver& r, const TrainerSection& tr) {
  OptimSection o;
  o.name = r.c.get_string("model.optim.name");
  if (o.name == "adamw_fp32OptState") o.name = "adamw";
  o.lr = r.c.get_double("model.optim.lr");
  if (!(o.lr >= 0 && std::isfinite(o.lr))) r.fail("model.optim.lr must be >= 0, got ", o.lr);
  o.weight_decay = r.c.get_double("model.optim.weight_decay");
  if (!(o.weight_decay >= 0)) r.fail("model.optim.weight_decay must be >= 0, got ", o.weight_decay);
  const auto betas = r.c.get_doubles("model.optim.betas");
  o.beta1 = betas[0], o.beta2 = betas[1];
  for (double b : betas)
    if (!(b >= 0 && b < 1))
      r.fail("model.optim.betas must be in [0, 1), got [", betas[0], ", ", betas[1], "]");
  o.eps = r.c.get_double("model.optim.eps");
  if (!(o.eps >= 0)) r.fail("model.optim.eps must be >= 0, got ", o.eps);
  o.momentum = r.c.get_double("model.optim.momentum");
  o.nesterov = r.c.get_bool("model.optim.nesterov");
  if (o.nesterov && !(o.momentum > 0))
    r.fail("model.optim.nesterov needs model.optim.momentum > 0, got ", o.momentum);
  o.sched_name = r.c.get_string("model.optim.sched.name");
  if (o.sched_name == "LinearAnnealingWithWarmUp") o.sched_name = "linear";
  if (o.sched_name == "CosineAnnealing") o.sched_name = "cosine";
  r.derive("model.optim.sched.max_steps", std::max<int64_t>(1, tr.max_steps));
  r.derive("model.optim.sched.warmup_steps",
           std::min<int64_t>(50, r.c.get_int("model.optim.sched.max_steps") / 10));
  o.warmup_steps = r.non_negative("model.optim.sched.warmup_steps");
  o.decay_steps = r.positive("model.optim.sched.max_steps");
  if (o.sched_name != "constant" && o.warmup_steps > o.decay_steps)
    r.fail("model.optim.sched.warmup_steps=", o.warmup_steps,
           " exceeds model.optim.sched.max_steps=", o.decay_steps);
  o.min_lr = r.c.get_double("model.optim.sched.min_lr");
  o.do_layer_norm_weight_decay = r.c.get_bool("model.do_layer_norm_weight_decay");
  if (!(o.min_lr >= 0 && o.min_lr <= o.lr))
    r.fail("model.optim.sched.min_lr=", o.min_lr, " must be in [0, model.optim.lr=", o.lr, "]");
  return o;
}

GenerationSection resolve_generation(Resolver& r, const DataSection& d) {
  GenerationSection g;
  g.prompt = r.c.get_string("generation.prompt");
  g.max_new_tokens = r.non_negative("generation.max_new_tokens");
  g.temperature = r.c.get_double("generation.temperature");
  if (!(g.temperature >= 0)) r.fail("generation.temperature must be >= 0, got ", g.temperature);
  g.top_k = r.non_negative("generation.top_k");
  if (g.max_new_tokens > 0 && g.prompt.empty() && d.kind == "text")
    r.fail("generation.prompt is empty (set generation.max_new_tokens=0 for no sample)");
  return g;
}

std::optional<LoraConfig> resolve_peft(Resolver& r) {
  const std::string p = "model_alignment_strategy.peft.";
  if (r.c.get(p + "lora_rank").is_null()) return std::nullopt;
  LoraConfig c;
  c.lora_rank = r.c.get_int(p + "lora_rank");
  c.lora_alpha = r.c.get_double(p + "lora_alpha");
  c.lora_dropout = r.c.get_double(p + "lora_dropout");
  const nlohmann::json& tm = r.c.get(p + "target_modules");
  if (tm.is_string())
    c.target_regex = tm.get<std::string>();
  else
    c.target_modules = tm.get<std::vector<std::string>>();
  c.merge_lora = r.c.get_bool(p + "merge_lora");
  if (c.lora_rank < 1) r.fail(p, "lora_rank must be >= 1, got ", c.lora_rank);
  if (!(c.lora_alpha > 0)) r.fail(p, "lora_alpha must be > 0, got ", c.lora_alpha);
  if (!(c.lora_dropout >= 0 && c.lora_dropout < 1))
    r.fail(p, "lora_dropout must be in [0, 1), got ", c.lora_dropout);
  if (c.target_modules.empty() && c.target_regex.empty()) r.fail(p, "target_modules is empty");
  return c;
}

}  // namespace

TrainConfig resolve(const Config& in) {
  Resolver r{in};
  TrainConfig t;
  t.init = resolve_init_from(r.c);
  t.seed = static_cast<uint64_t>(r.c.get_int("seed"));
  t.out_dir = r.c.get_string("exp_manager.exp_dir");
  if (t.out_dir.empty()) r.fail("exp_manager.exp_dir must not be empty");
  t.exp = resolve_exp_manager(r);
  t.exp.checkpoint.dirpath = t.out_dir + "/checkpoints";
  if (t.exp.checkpoint.monitor == "val_loss" && t.exp.create_checkpoint_callback &&
      r.c.get_int("trainer.val_check_interval") == 0)
    r.fail(
        "exp_manager.checkpoint_callback_params.monitor=val_loss needs "
        "trainer.val_check_interval > 0");
  t.trainer = resolve_trainer(r);
  t.data = resolve_data(r);
  t.model = resolve_model(r, t.data);
  t.dist = detail::resolve_distributed(r, t.model);
  t.lora = resolve_peft(r);
  t.alignment = resolve_alignment(r.c, t);
  t.grad_accum_steps = detail::resolve_batching(r, t.data, t.dist);
  detail::check_pipeline_schedule(r, t);
  detail::check_tensor_parallel(r, t);
  t.optim = resolve_optim(r, t.trainer);
  t.precision = resolve_precision_section(r);
  t.generation = resolve_generation(r, t.data);
  detail::check_context_parallel(r, t);
  t.resolved = r.c;
  return t;
}

}  // namespace nxd::train_app
