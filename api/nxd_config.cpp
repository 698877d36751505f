#include "nxd/api/nxd_config.h"

#include "nxd/api/lora.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"

namespace nxd::api {

namespace {

[[noreturn]] void unknown(const std::string& section, const std::string& key, const char* known) {
  throw ConfigError(str("[NxDConfig] unknown key '", section, key, "' (known: ", known, ")"));
}

// A pipeline_config mode read from its name by `parse`; an unknown name is NxDConfig's ConfigError
// naming the key and the allowed names.
template <class Parse>
auto pipeline_mode(const char* key, const char* allowed, const nlohmann::json& x, Parse parse) {
  const std::string name = x.get<std::string>();
  try {
    return parse(name);
  } catch (const ConfigError&) {
    throw ConfigError(
        str("[NxDConfig] pipeline_config.", key, " must be ", allowed, ", got '", name, "'"));
  }
}

void read_pipeline(const nlohmann::json& v, PipelineConfig& p) {
  for (const auto& [k, x] : v.items()) {
    if (k == "num_microbatches")
      p.num_microbatches = x.get<int>();
    else if (k == "schedule")
      p.schedule =
          pipeline_mode("schedule", "gpipe, 1f1b or interleaved", x, pipeline::parse_schedule);
    else if (k == "virtual_pipeline_size")
      p.virtual_pipeline_size = x.get<int>();
    else if (k == "partition")
      p.partition = pipeline_mode("partition", "parameters or modeled_cost", x,
                                  pipeline::parse_partition_balance);
    else if (k == "pipeline_cuts")
      p.pipeline_cuts =
          x.is_null() ? std::vector<std::string>{} : x.get<std::vector<std::string>>();
    else
      unknown("pipeline_config.", k,
              "num_microbatches, schedule, virtual_pipeline_size, pipeline_cuts, partition");
  }
}

void read_optimizer(const nlohmann::json& v, OptimizerConfig& o) {
  for (const auto& [k, x] : v.items()) {
    if (k == "zero_one_enabled")
      o.zero_one_enabled = x.get<bool>();
    else if (k == "optimizer_offload")
      o.optimizer_offload = x.get<bool>();
    else if (k == "reshard_after_forward")
      o.reshard_after_forward = x.get<bool>();
    else if (k == "zero3_prefetch")
      o.zero3_prefetch = x.get<bool>() ? optim::UnitPrefetch::next_unit : optim::UnitPrefetch::none;
    else if (k == "zero3_shard_pipeline_head")
      o.zero3_pipeline_head =
          x.get<bool>() ? optim::PipelineHeadUnit::sharded : optim::PipelineHeadUnit::whole;
    else if (k == "zero_stage")
      o.zero_stage = optim::zero_stage_from_int(x.get<int64_t>(), "optimizer_config.zero_stage");
    else if (k == "grad_clipping")
      o.grad_clipping = x.get<bool>();
    else if (k == "max_grad_norm")
      o.max_grad_norm = x.get<double>();
    else
      unknown("optimizer_config.", k,
              "zero_one_enabled, zero_stage, optimizer_offload, reshard_after_forward, "
              "zero3_prefetch, zero3_shard_pipeline_head, grad_clipping, max_grad_norm");
  }
}

void read_model_init(const nlohmann::json& v, ModelInitConfig& m) {
  for (const auto& [k, x] : v.items()) {
    if (k == "meta_device_init")
      m.meta_device_init = x.get<bool>();
    else if (k == "seed")
      m.seed = x.get<uint64_t>();
    else if (k == "sequential_move_factor")
      x.get<int>();  // NxD's: how many processes move models to the device at once (no analogue)
    else
      unknown("model_init_config.", k,
              "meta_device_init, seed, sequential_move_factor; param_init_fn is set in code");
  }
}

void read_mixed(const nlohmann::json& v, MixedPrecisionConfig& m) {
  for (const auto& [k, x] : v.items()) {
    std::optional<bool> b = x.is_null() ? std::nullopt : std::optional<bool>(x.get<bool>());
    if (k == "use_master_weights")
      m.use_master_weights = b;
    else if (k == "use_fp32_grad_acc")
      m.use_fp32_grad_acc = b;
    else
      unknown("mixed_precision_config.", k, "use_master_weights, use_fp32_grad_acc");
  }
}

}  // namespace

NxDConfig NxDConfig::from_json(const nlohmann::json& j) {
  NxDConfig c;
  if (!j.is_object()) throw ConfigError(str("[NxDConfig] expected a mapping, got ", j.dump()));
  auto section = [](const nlohmann::json& v, const char* name) -> const nlohmann::json& {
    if (!v.is_object() && !v.is_null())
      throw ConfigError(str("[NxDConfig] ", name, " must be a mapping, got ", v.dump()));
    static const nlohmann::json empty = nlohmann::json::object();
    return v.is_null() ? empty : v;
  };
  std::string at;  // the key being read, for messages
  try {
    for (const auto& [k, v] : j.items()) {
      at = k;
      if (k == "tensor_parallel_size") {
        c.tensor_parallel_size = v.get<int>();
      } else if (k == "pipeline_parallel_size") {
        c.pipeline_parallel_size = v.get<int>();
      } else if (k == "context_parallel_size") {
        c.context_parallel_size = v.get<int>();
      } else if (k == "expert_parallel_size") {
        c.expert_parallel_size = v.get<int>();
      } else if (k == "pipeline_config") {
        read_pipeline(section(v, "pipeline_config"), c.pipeline_config);
      } else if (k == "optimizer_config") {
        read_optimizer(section(v, "optimizer_config"), c.optimizer_config);
      } else if (k == "activation_checkpoint_config") {
        c.activation_checkpoint_config = v.is_null() ? "" : v.get<std::string>();
      } else if (k == "pad_model") {
        c.pad_model = v.get<bool>();
      } else if (k == "sequence_parallel") {
        c.sequence_parallel = v.get<bool>();
      } else if (k == "model_init_config") {
        read_model_init(section(v, "model_init_config"), c.model_init_config);
      } else if (k == "mixed_precision_config") {
        read_mixed(section(v, "mixed_precision_config"), c.mixed_precision_config);
      } else if (k == "precision") {
        c.precision = v.get<std::string>();
      } else if (k == "grad_bucket_mb") {
        c.grad_bucket_mb = v.get<double>();
      } else if (k == "lora_config") {
        LoraConfig lc;
        if (!v.is_null() && read_lora_config(v, "lora_config.", lc)) c.lora_config = lc;
      } else {
        unknown(
            "", k,
            "tensor_parallel_size, pipeline_parallel_size, expert_parallel_size, "
            "pipeline_config, "
            "optimizer_config, activation_checkpoint_config, pad_model, sequence_parallel, "
            "model_init_config, mixed_precision_config, precision, grad_bucket_mb, lora_config");
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(str("[NxDConfig] key '", at, "' in ", j.dump(), ": ", e.what()));
  }
  return c;
}

ResolvedPrecision resolve_precision(const NxDConfig& c) {
  ResolvedPrecision r;
  const std::string& p = c.precision;
  const auto& mp = c.mixed_precision_config;
  if (p == "fp32") {
  } else if (p == "autocast") {
    r.matmul = blas::MatmulPrecision::bf16;
  } else if (p == "mixed_precision") {
    r.param_dtype = DType::bf16;
    r.master_weights = mp.use_master_weights.value_or(true);
    r.fp32_grad_acc = mp.use_fp32_grad_acc.value_or(true);
  } else if (p == "bf16SR") {
    r.param_dtype = DType::bf16;
    r.master_weights = mp.use_master_weights.value_or(false);
    r.fp32_grad_acc = mp.use_fp32_grad_acc.value_or(false);
    r.stochastic_rounding = true;
  } else {
    throw ConfigError(
        str("[NxDConfig] precision must be fp32, autocast, mixed_precision or bf16SR, "
            "got '",
            p, "'"));
  }
  // f32 parameters are their own master weights and accumulate their gradients in f32: the
  // options only matter for bf16 ones (NxD's ZeRO-1 defaults set them for any precision)
  if (r.param_dtype != DType::bf16) r.master_weights = r.fp32_grad_acc = false;
  return r;
}

NxDConfig neuronx_distributed_config(NxDConfig c) {
  auto fail = [](auto&&... a) { throw ConfigError(str("[neuronx_distributed_config] ", a...)); };
  if (c.tensor_parallel_size < 1 || c.pipeline_parallel_size < 1 || c.context_parallel_size < 1)
    fail(
        "tensor_parallel_size, pipeline_parallel_size and context_parallel_size must be >= 1, "
        "got ",
        c.tensor_parallel_size, ", ", c.pipeline_parallel_size, " and ", c.context_parallel_size);
  const int world = current_context().world_size();
  if (world % (c.tensor_parallel_size * c.pipeline_parallel_size * c.context_parallel_size) != 0)
    fail("the world of ", world, " rank(s) is not tensor_parallel_size ", c.tensor_parallel_size,
         " x pipeline_parallel_size ", c.pipeline_parallel_size, " x context_parallel_size ",
         c.context_parallel_size, " x a data-parallel size");
  const int dp_size =
      world / (c.tensor_parallel_size * c.pipeline_parallel_size * c.context_parallel_size);
  if (c.expert_parallel_size < 1 || (dp_size * c.context_parallel_size) % c.expert_parallel_size)
    fail("expert_parallel_size ", c.expert_parallel_size,
         " must be >= 1 and divide the data-parallel size ", dp_size, " x context_parallel_size ",
         c.context_parallel_size);
  const PipelineConfig& pc = c.pipeline_config;
  if (pc.num_microbatches < 1 || pc.virtual_pipeline_size < 1)
    fail("pipeline_config.num_microbatches and virtual_pipeline_size must be >= 1, got ",
         pc.num_microbatches, " and ", pc.virtual_pipeline_size);
  const std::string& ac = c.activation_checkpoint_config;
  if (!ac.empty() && ac != "full" && ac != "selective")
    fail("activation_checkpoint_config must be empty, full or selective, got '", ac, "'");
  if (c.optimizer_config.grad_clipping && !(c.optimizer_config.max_grad_norm > 0))
    fail("optimizer_config.max_grad_norm must be > 0 with grad_clipping, got ",
         c.optimizer_config.max_grad_norm);
  if (!(c.grad_bucket_mb > 0)) fail("grad_bucket_mb must be > 0, got ", c.grad_bucket_mb);
  const optim::ZeroStage zs = c.optimizer_config.zero_stage;
  if (c.optimizer_config.zero_one_enabled && zs != optim::ZeroStage::none &&
      zs != optim::ZeroStage::one)
    fail("optimizer_config.zero_one_enabled=true contradicts optimizer_config.zero_stage=",
         optim::zero_stage_name(zs), " (zero_one_enabled is stage 1; set one of them)");
  if (c.optimizer_config.optimizer_offload && c.optimizer_config.stage() == optim::ZeroStage::none)
    fail(
        "optimizer_config.optimizer_offload=true needs optimizer_config.zero_stage 1, 2 or 3 (or "
        "zero_one_enabled): only the sharded optimizer's state is offloaded");
  const ResolvedPrecision rp = resolve_precision(c);
  if (!parallel_state::model_parallel_is_initialized()) {
    parallel_state::initialize_model_parallel(
        parallel_state::ParallelSizes{.tensor = c.tensor_parallel_size,
                                      .pipeline = c.pipeline_parallel_size,
                                      .context = c.context_parallel_size,
                                      .expert = c.expert_parallel_size});
  } else if (parallel_state::get_tensor_model_parallel_size() != c.tensor_parallel_size ||
             parallel_state::get_pipeline_model_parallel_size() != c.pipeline_parallel_size ||
             parallel_state::get_context_parallel_size() != c.context_parallel_size ||
             parallel_state::get_expert_model_parallel_size() != c.expert_parallel_size) {
    fail(
        "parallel_state is already initialized with tensor x pipeline x context x expert "
        "parallel size ",
        parallel_state::get_tensor_model_parallel_size(), " x ",
        parallel_state::get_pipeline_model_parallel_size(), " x ",
        parallel_state::get_context_parallel_size(), " x ",
        parallel_state::get_expert_model_parallel_size(), ", the config asks for ",
        c.tensor_parallel_size, " x ", c.pipeline_parallel_size, " x ", c.context_parallel_size,
        " x ", c.expert_parallel_size);
  }
  blas::set_matmul_precision(rp.matmul);
  return c;
}

}  // namespace nxd::api
