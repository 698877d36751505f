#pragma once
// int8 weight-only quantization of linear layers, for generation (no gradient). A quantized layer
// keeps its weight W [out, in] as int8 values q and one f32 scale per output row
// (runtime/kernels/gemv_int8.h: symmetric, scale = max |W[row]| / 127, |W - q * scale| <=
// scale / 2) and multiplies by it directly: one byte per weight read per decode step.
//
// The int8 data is not a Tensor dtype: it lives in an Int8Weight held by the layer
// (QuantizableLinear), beside the f32/bf16 parameter "weight", which keeps its name and values
// (checkpoints, named_parameters and init are unchanged); forward uses the int8 weight once one is
// set. Eager execution only: a traced graph cannot record it (int8_linear throws under a
// tracer). Tensor parallel as the unquantized layers: a shard of rows (column parallel, the QKV
// projections) has its rows' own scales; a shard of columns (row parallel) takes each row's
// scale over the whole row (the largest of the ranks' parts, one all-reduce at quantization), so
// every rank holds exactly its slice of the TP-1 int8 weight.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/layers/module.h"

namespace nxd {

enum class WeightQuant { none, int8 };
const char* weight_quant_name(WeightQuant q);
// "none" or "int8"; throws ConfigError naming the value otherwise.
WeightQuant weight_quant_from_name(const std::string& name);

// A linear layer's weight W [out, in] as int8 values q [out, in] and scales [out] (f32).
class Int8Weight {
 public:
  // w: f32 or bf16 on the host, [out, in] or [stride, out / stride, in] (a strided column shard,
  // taken as [out, in]); bf16 is widened to f32 first, exactly. With `whole_rows_over`, w holds
  // a part of each row (its columns) and the scales are the rows' over that group (collective).
  static std::shared_ptr<const Int8Weight> quantize(const Tensor& w,
                                                    Communicator* whole_rows_over = nullptr);
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  const int8_t* values() const { return q_.data(); }
  const float* scales() const { return scale_.data(); }
  Tensor dequantize() const;  // f32 [out, in]: q * scale
  int64_t bytes() const { return out_ * in_ + 4 * out_; }

 private:
  int64_t out_ = 0, in_ = 0;
  std::vector<int8_t> q_;
  std::vector<float> scale_;
};

// y = x @ W^T + bias with W the int8 weight: x [..., in] f32 or bf16, bias [out] (x's dtype) or
// undefined; y [..., out] in x's dtype (bf16: computed in f32, rounded once). Inference only:
// throws when x requires a gradient with grad mode on, and under an active tracer.
Tensor int8_linear(const Tensor& x, const Int8Weight& w, const Tensor& bias);

// A linear layer that can run on an int8 weight (ParallelLinearBase, the GQA QKV projections).
class QuantizableLinear {
 public:
  virtual ~QuantizableLinear() = default;
  const std::shared_ptr<const Int8Weight>& int8_weight() const { return int8_; }
  void set_int8_weight(std::shared_ptr<const Int8Weight> w) { int8_ = std::move(w); }
  // linear(x, w, b), or int8_linear(x, *int8_weight(), b) once an int8 weight is set (w is then
  // the parameter it was quantized from and is not read).
  Tensor weight_product(const Tensor& x, const Tensor& w, const Tensor& b) const;

 private:
  std::shared_ptr<const Int8Weight> int8_;
};

struct QuantizeOptions {
  WeightQuant format = WeightQuant::int8;
  // Modules (hierarchical names, as named_modules) left as they are, e.g. {"lm_head"}.
  std::vector<std::string> skip;
};

struct QuantizeSummary {
  int64_t layers = 0;        // linear layers quantized
  int64_t weights = 0;       // their weight elements
  int64_t bytes_before = 0;  // those weights in their own dtype
  int64_t bytes_after = 0;   // int8 values and f32 scales
};

// Sets an int8 weight on every QuantizableLinear of `model` not in opts.skip, from its
// parameter "weight" (collective over the TP group for row-parallel layers: every rank calls it).
// Embeddings are never quantized. Throws InvalidArgument, naming the parameter, for any other 2-D
// parameter outside the skipped modules that no quantizable layer owns (e.g. a mixture-of-experts'
// experts), which this format does not cover; nothing is changed then.
QuantizeSummary quantize_linear_layers(Module& model, const QuantizeOptions& opts = {});

}  // namespace nxd
