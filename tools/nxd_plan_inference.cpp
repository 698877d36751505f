// nxd-plan --inference: the modeled latency of generation for a model given by a preset, files
// and --set keys (no checkpoint), at distributed_strategy.tensor_model_parallel_size on one
// instance: TTFT, TPOT and output tokens/s from the sim inference model
// (layers/models/inference_model.h; docs/design/inference_model.md), with heads, FFN and
// vocabulary padded to the TP degree as the Neuron libraries pad them.
#include <cstdio>

#include "nxd/layers/models/inference_model.h"
#include "nxd/runtime/error.h"
#include "nxd_plan.h"

namespace nxd::plan_tool {

namespace {

// The training-only options that mean nothing to an inference estimate: refused by name.
void check_inference_args(const Args& a) {
  if (a.search) throw UserError("[nxd-plan] --inference and --search do not go together");
  if (!a.timeline.empty())
    throw UserError(str("[nxd-plan] --timeline '", a.timeline, "' is for a training step"));
  if (a.nodes_given && a.nodes != 1)
    throw UserError(str("[nxd-plan] --inference models one instance, got --nodes ", a.nodes));
}

}  // namespace

int inference(const Args& a) {
  check_inference_args(a);
  const sim::MachineSpec m = sim::machine(a.instance);
  train_app::Config c = make_config(a, m);
  const int64_t tp = c.get_int("distributed_strategy.tensor_model_parallel_size");
  if (tp < 1 || tp > m.world_size())
    throw UserError(str("[nxd-plan] distributed_strategy.tensor_model_parallel_size=", tp,
                        " must be in [1, ", m.world_size(), "] (the NeuronCores of ", m.name, ")"));
  if (c.get_int("distributed_strategy.pipeline_model_parallel_size") != 1)
    throw UserError(
        str("[nxd-plan] --inference models tensor parallelism only, got "
            "distributed_strategy.pipeline_model_parallel_size=",
            c.get_int("distributed_strategy.pipeline_model_parallel_size")));
  // The model's own sizes: resolved at TP 1 (the estimate pads them for tp itself).
  c.apply_override("distributed_strategy.tensor_model_parallel_size=1");
  c.apply_override("distributed_strategy.sequence_parallel=false");
  c.apply_override("backend.world_size=1");
  const train_app::TrainConfig t = train_app::resolve(c);
  ModelConfig mc = train_app::model_config(t);
  mc.kv_size_multiplier = 1;
  mc.dtype = t.precision.type == "fp32" ? DType::f32 : DType::bf16;
  InferenceModelOptions o;
  o.tp = static_cast<int>(tp);
  o.instance = a.instance;
  o.batch = a.batch, o.prompt_tokens = a.prompt_tokens, o.new_tokens = a.new_tokens;
  if (a.max_context_tokens > 0 && a.max_context_tokens < a.prompt_tokens)
    throw UserError(str("[nxd-plan] --max-context-tokens ", a.max_context_tokens,
                        " is below --prompt-tokens ", a.prompt_tokens));
  o.max_context_tokens = a.max_context_tokens;
  o.prefill_attention =
      a.prefill_attention == "flash" ? PrefillAttention::flash : PrefillAttention::materialized;
  const InferenceEstimate e = estimate_inference(mc, o);
  const double gib = 1024.0 * 1024 * 1024;
  const double used = static_cast<double>(e.weight_bytes + e.kv_bytes);
  const bool fits = used <= static_cast<double>(m.core.hbm_bytes);
  std::printf(
      "nxd-plan --inference: %s on %s at TP %lld, batch %lld, %lld prompt + %lld new tokens, "
      "%s\n",
      a.model.empty() ? t.model.arch.c_str() : a.model.c_str(), e.machine.c_str(),
      static_cast<long long>(tp), static_cast<long long>(o.batch),
      static_cast<long long>(o.prompt_tokens), static_cast<long long>(o.new_tokens),
      mc.dtype == DType::bf16 ? "bf16" : "fp32");
  std::printf("padded for TP %lld as the Neuron libraries pad: %s%s\n", static_cast<long long>(tp),
              e.padding.describe().c_str(), e.padding.needed() ? "" : " (nothing padded)");
  std::printf("per NeuronCore: weights %.2f GiB + KV cache %.2f GiB of %.2f GiB HBM (%s)\n",
              static_cast<double>(e.weight_bytes) / gib, static_cast<double>(e.kv_bytes) / gib,
              static_cast<double>(m.core.hbm_bytes) / gib, fits ? "fits" : "does not fit");
  std::printf(
      "beyond the rooflines, per NeuronCore: prefill %lld kernels + %lld collectives (+%.2f ms), "
      "softmax +%.2f ms; decode step %lld kernels + %lld collectives (+%.2f ms), softmax "
      "+%.2f ms; sampling +%.3f ms a step\n",
      static_cast<long long>(e.prefill.kernels), static_cast<long long>(e.prefill.collectives),
      e.prefill.fixed_seconds * 1e3, e.prefill.softmax_seconds * 1e3,
      static_cast<long long>(e.decode.kernels), static_cast<long long>(e.decode.collectives),
      e.decode.fixed_seconds * 1e3, e.decode.softmax_seconds * 1e3, e.sampling_seconds * 1e3);
  std::printf(
      "prefill: the prompt in its context bucket of %lld tokens; elementwise kernels fused "
      "(%+.2f ms), all-reduces in bf16 (%+.2f ms), %s attention (%+.2f ms)\n",
      static_cast<long long>(e.context_tokens), e.prefill.fused_seconds * 1e3,
      e.prefill.collective_dtype_seconds * 1e3, a.prefill_attention.c_str(),
      e.prefill.attention_seconds * 1e3);
  std::printf("predicted inference: TTFT %.2f ms, TPOT %.2f ms, %.1f output tokens/s\n",
              e.ttft * 1e3, e.tpot * 1e3, e.output_tokens_per_s);
  return fits ? 0 : 3;
}

}  // namespace nxd::plan_tool
