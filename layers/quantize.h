#pragma once
// Weight-only quantization of linear layers, for generation (no gradient): int8 per output row,
// or 4-bit in groups (Int4Weight below, runtime/kernels/gemv_int4.h). A quantized layer
// keeps its weight W [out, in] as int8 values q and one f32 scale per output row
// (runtime/kernels/gemv_int8.h: symmetric, scale = max |W[row]| / 127, |W - q * scale| <=
// scale / 2) and multiplies by it directly: one byte per weight read per decode step.
//
// The int8 data is not a Tensor dtype: it lives in an Int8Weight held by the layer
// (QuantizableLinear). The layer's f32/bf16 parameter "weight" keeps its name, shape and dtype but
// not its values: quantize_linear_layers (and the quantized-checkpoint loader) free its storage,
// turning it into a meta tensor, so a quantized model holds only the quantized bytes
// (resident_weight_bytes). Anything that would read those values refuses, naming the layer
// (check_no_quantized_layers: checkpoint save, LoRA; the quantized product refuses a gradient, so
// no training), and a meta tensor's data is never readable. A traced graph records a quantized
// layer as the op int8_linear / int4_linear whose parameters are the quantized tensors
// (quantized_tensors) and replays the same kernels, so traced output equals eager bitwise.
// Tensor parallel as the unquantized layers: a shard of rows (column parallel, the QKV projections)
// has its rows' own scales; a shard of columns (row parallel) takes each row's scale over the whole
// row (the largest of the ranks' parts, one all-reduce at quantization), so every rank holds
// exactly its slice of the TP-1 int8 weight.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/layers/module.h"
#include "nxd/runtime/kernels/gemv_int4.h"

namespace nxd {

enum class WeightQuant { none, int8, int4 };
const char* weight_quant_name(WeightQuant q);
// "none", "int8" or "int4"; throws ConfigError naming the value otherwise.
WeightQuant weight_quant_from_name(const std::string& name);

// A linear layer's weight W [out, in] as int8 values q [out, in] and scales [out] (f32).
class Int8Weight {
 public:
  // w: f32 or bf16 on the host, [out, in] or [stride, out / stride, in] (a strided column shard,
  // taken as [out, in]); bf16 is widened to f32 first, exactly. With `whole_rows_over`, w holds
  // a part of each row (its columns) and the scales are the rows' over that group (collective).
  static std::shared_ptr<const Int8Weight> quantize(const Tensor& w,
                                                    Communicator* whole_rows_over = nullptr);
  // A weight read back from a file (checkpoint/quantized.h): values [out, in] and scales [out].
  // InvalidArgument naming the sizes unless they match and every scale is finite and >= 0.
  static std::shared_ptr<const Int8Weight> from_parts(int64_t out, int64_t in,
                                                      std::vector<int8_t> q,
                                                      std::vector<float> scale);
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  const int8_t* values() const { return static_cast<const int8_t*>(q_.raw_data()); }
  const float* scales() const { return scale_.data<float>(); }
  // The same bytes as tensors (a traced graph's parameters): the values' bytes row-major in i32
  // words [ceil(out * in / 4)] (the last word zero-padded), the scales f32 [out].
  const Tensor& values_tensor() const { return q_; }
  const Tensor& scales_tensor() const { return scale_; }
  Tensor dequantize() const;  // f32 [out, in]: q * scale
  int64_t bytes() const { return q_.nbytes() + scale_.nbytes(); }

 private:
  int64_t out_ = 0, in_ = 0;
  Tensor q_, scale_;
};

// y = x @ W^T + bias with W the int8 weight: x [..., in] f32 or bf16, bias [out] (x's dtype) or
// undefined; y [..., out] in x's dtype (bf16: computed in f32, rounded once). Inference only:
// throws when x requires a gradient with grad mode on. Traced, it is the op "int8_linear" with
// inputs (x, values_tensor, scales_tensor, bias) and attributes out, in (int8_linear_parts).
Tensor int8_linear(const Tensor& x, const Int8Weight& w, const Tensor& bias);
// The same on the weight's tensors (what a traced graph's replay calls): q i32 words holding the
// [out, in] int8 values' bytes, scales f32 [out]. InvalidArgument naming the sizes otherwise.
Tensor int8_linear_parts(const Tensor& x, const Tensor& q, const Tensor& scales, const Tensor& bias,
                         int64_t out, int64_t in);

// A linear layer's weight W [out, in] in 4-bit groups along `in` (runtime/kernels/gemv_int4.h:
// group 32, 64 or 128, symmetric or with a per-group minimum).
class Int4Weight {
 public:
  // w as Int8Weight::quantize takes it. A part of each row (a row-parallel shard) is quantized on
  // its own: groups never cross ranks when the part's length is a multiple of the group, which is
  // required (InvalidArgument naming the sizes), so every rank holds exactly its slice of the
  // TP-1 4-bit weight and no collective is needed.
  static std::shared_ptr<const Int4Weight> quantize(
      const Tensor& w, int64_t group, kernels::Int4Zero zero,
      kernels::Int4Activations act = kernels::Int4Activations::f32);
  // A weight read back from a file: l's value_bytes() bytes, groups() scales and, asymmetric,
  // groups() minimums (else empty). InvalidArgument naming the sizes otherwise.
  static std::shared_ptr<const Int4Weight> from_parts(const kernels::Int4Layout& l,
                                                      std::vector<uint8_t> q,
                                                      std::vector<float> scale,
                                                      std::vector<float> min);
  const kernels::Int4Layout& layout() const { return l_; }
  int64_t out_features() const { return l_.n; }
  int64_t in_features() const { return l_.k; }
  const uint8_t* values() const { return static_cast<const uint8_t*>(q_.raw_data()); }
  const float* scales() const { return scale_.data<float>(); }
  const float* mins() const { return min_.defined() ? min_.data<float>() : nullptr; }  // null: sym
  // As tensors: the value bytes in i32 words [ceil(value_bytes / 4)], scales and (asymmetric)
  // minimums f32 [groups] (undefined when symmetric).
  const Tensor& values_tensor() const { return q_; }
  const Tensor& scales_tensor() const { return scale_; }
  const Tensor& mins_tensor() const { return min_; }
  Tensor dequantize() const;  // f32 [out, in]
  int64_t bytes() const {
    return q_.nbytes() + scale_.nbytes() + (min_.defined() ? min_.nbytes() : 0);
  }

 private:
  kernels::Int4Layout l_;
  Tensor q_, scale_, min_;
};

// int8_linear's contract with a 4-bit weight; traced, the op "int4_linear" with inputs (x,
// values_tensor, scales_tensor, mins_tensor, bias) and attributes n, k, group, zero and act (the
// Int4Activations; a graph without it replays with f32 activations).
Tensor int4_linear(const Tensor& x, const Int4Weight& w, const Tensor& bias);
Tensor int4_linear_parts(const Tensor& x, const Tensor& q, const Tensor& scales, const Tensor& mins,
                         const Tensor& bias, const kernels::Int4Layout& l);

// The tensors of `model`'s quantized layers by name, "<layer>.qweight", "<layer>.scales" and
// (int4 asymmetric) "<layer>.mins": the parameters a traced graph of the model records.
std::vector<std::pair<std::string, Tensor>> quantized_tensors(Module& model);

// A linear layer that can run on a quantized weight (ParallelLinearBase, the GQA QKV projections).
class QuantizableLinear {
 public:
  virtual ~QuantizableLinear() = default;
  const std::shared_ptr<const Int8Weight>& int8_weight() const { return int8_; }
  const std::shared_ptr<const Int4Weight>& int4_weight() const { return int4_; }
  void set_int8_weight(std::shared_ptr<const Int8Weight> w) { int8_ = std::move(w), int4_.reset(); }
  void set_int4_weight(std::shared_ptr<const Int4Weight> w) { int4_ = std::move(w), int8_.reset(); }
  bool quantized() const { return int8_ || int4_; }
  // linear(x, w, b), or int8_linear / int4_linear once a quantized weight is set (w is then the
  // parameter it was quantized from and is not read).
  Tensor weight_product(const Tensor& x, const Tensor& w, const Tensor& b) const;

 private:
  std::shared_ptr<const Int8Weight> int8_;
  std::shared_ptr<const Int4Weight> int4_;
};

struct QuantizeOptions {
  WeightQuant format = WeightQuant::int8;
  int64_t group = 32;                                     // int4: inputs per scale
  kernels::Int4Zero zero = kernels::Int4Zero::symmetric;  // int4: with a per-group minimum or not
  // int4: f32 activations (the default), or int8 per 32-input block (llama.cpp's Q8_0) with
  // integer dot products (runtime/kernels/gemv_int4.h: Int4Activations; spelled ":q8")
  kernels::Int4Activations act = kernels::Int4Activations::f32;
  // Modules (hierarchical names, as named_modules) left as they are, e.g. {"lm_head"}.
  std::vector<std::string> skip;
  // A causal LM's output head (layers/models/quantize_lm.h): none keeps it in the model's dtype;
  // int8 (per row, llama.cpp's Q8_0 heads), or int4 in this format's group and zero point.
  WeightQuant head = WeightQuant::none;
};

// A format as the command lines write it: "int8", or "int4" with optional ":<group>" (32, 64,
// 128; default 32), ":sym" / ":asym" (default symmetric) and ":q8" (int8 activations), e.g.
// "int4:64:asym", "int4:32:q8"; then
// optionally ":head" (the output head in int8) or ":head=int8" / ":head=int4" (int4: the group
// and zero point above), e.g. "int4:head". ConfigError naming the value otherwise.
QuantizeOptions parse_weight_quant(const std::string& spec);
// "int8", "int4 (groups of 32, symmetric)", "int4 (groups of 32, symmetric), head int8",
// "int4 (groups of 32, symmetric, int8 activations)".
std::string describe(const QuantizeOptions& opts);
// The options of a layer quantized in format `f` (int8, or int4 in opts' group and zero point).
QuantizeOptions with_format(const QuantizeOptions& opts, WeightQuant f);

struct QuantizeSummary {
  int64_t layers = 0;        // linear layers quantized
  int64_t weights = 0;       // their weight elements
  int64_t bytes_before = 0;  // those weights in their own dtype
  int64_t bytes_after = 0;   // quantized values, scales (and int4 minimums)
};

// Quantizes w (the layer's weight, as Int8Weight::quantize takes it) into `layer` in opts.format
// (int4: opts.group, opts.zero); `whole_rows_over` as Int8Weight::quantize. Returns the quantized
// bytes.
int64_t set_quantized_weight(QuantizableLinear& layer, const Tensor& w, const QuantizeOptions& opts,
                             Communicator* whole_rows_over = nullptr);

// A module that holds quantized weights outside its QuantizableLinear submodules (CausalLM's tied
// output head, quantized beside the embedding it shares): quantized_tensors and
// resident_weight_bytes count them under the names it gives (as module names, e.g. "lm_head").
class QuantizedWeightOwner {
 public:
  virtual ~QuantizedWeightOwner() = default;
  virtual std::vector<std::pair<std::string, const QuantizableLinear*>> owned_quantized() const = 0;
};

// Sets an int8 weight on every QuantizableLinear of `model` not in opts.skip, from its
// parameter "weight" (collective over the TP group for row-parallel layers: every rank calls it).
// Embeddings are never quantized. Throws InvalidArgument, naming the parameter, for any other 2-D
// parameter outside the skipped modules that no quantizable layer owns (e.g. a mixture-of-experts'
// experts), which this format does not cover; nothing is changed then.
// The layer's parameter "weight" then has its storage freed (a meta tensor of the same shape and
// dtype), unless another module's tensor shares that storage (a tied weight), which stays.
QuantizeSummary quantize_linear_layers(Module& model, const QuantizeOptions& opts = {});

// Frees the values of a quantized layer's parameter `w`: its TensorImpl (every handle on it) points
// at meta storage of the same shape and dtype afterwards.
void release_quantized_weight(const Tensor& w);

// Throws InvalidArgument naming the first quantized layer of `model` (hierarchical name) and its
// format: `what` ("save_checkpoint", "LoRA") needs the unquantized weights, which quantization
// freed. A model without quantized layers passes.
void check_no_quantized_layers(const Module& model, const std::string& what);

// The bytes a model's weights occupy in memory: its host parameters and buffers (each storage
// once; the freed weights of quantized layers are meta and count 0) plus the quantized layers'
// int8/int4 values, scales and minimums.
struct WeightBytes {
  int64_t dense = 0;      // host parameters and buffers
  int64_t quantized = 0;  // Int8Weight / Int4Weight bytes
  int64_t total() const { return dense + quantized; }
};
WeightBytes resident_weight_bytes(const Module& model);

}  // namespace nxd
