#include "nxd/layers/quantize.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "nxd/autograd/ops.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/runtime/kernels/gemv_int8.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

const char* weight_quant_name(WeightQuant q) {
  return q == WeightQuant::int8 ? "int8" : "none";
}

WeightQuant weight_quant_from_name(const std::string& name) {
  if (name == "none") return WeightQuant::none;
  if (name == "int8") return WeightQuant::int8;
  throw ConfigError(str("[quantize] unknown weight format '", name, "' (known: none, int8)"));
}

std::shared_ptr<const Int8Weight> Int8Weight::quantize(const Tensor& w,
                                                       Communicator* whole_rows_over) {
  NXD_CHECK(w.defined() && (w.dim() == 2 || w.dim() == 3) && !w.is_meta() &&
                (w.dtype() == DType::f32 || w.dtype() == DType::bf16),
            "[quantize] int8 needs a host f32 or bf16 weight [out, in], got ",
            w.defined() ? w.desc() : "undefined");
  NoGradGuard no_grad;
  const Tensor wf = w.detach().to(DType::f32).contiguous();
  auto r = std::make_shared<Int8Weight>();
  r->in_ = w.size(-1);
  r->out_ = w.numel() / r->in_;
  r->q_.resize(static_cast<size_t>(r->out_ * r->in_));
  r->scale_.resize(static_cast<size_t>(r->out_));
  kernels::int8_row_scales(r->scale_.data(), wf.data<float>(), r->out_, r->in_);
  if (whole_rows_over && whole_rows_over->size() > 1)
    whole_rows_over->all_reduce(r->scale_.data(), r->scale_.data(), r->out_, DType::f32,
                                ReduceOp::max);
  kernels::quantize_int8_with_scales(r->q_.data(), r->scale_.data(), wf.data<float>(), r->out_,
                                     r->in_);
  return r;
}

Tensor Int8Weight::dequantize() const {
  Tensor w = empty({out_, in_}, DType::f32);
  float* p = w.data<float>();
  for (int64_t i = 0; i < out_; ++i)
    for (int64_t j = 0; j < in_; ++j)
      p[i * in_ + j] = static_cast<float>(q_[i * in_ + j]) * scale_[i];
  return w;
}

Tensor int8_linear(const Tensor& x, const Int8Weight& w, const Tensor& bias) {
  const int64_t K = w.in_features(), N = w.out_features();
  NXD_CHECK_SHAPE(x.defined() && x.dim() >= 1 && x.size(-1) == K,
                  "[int8_linear] expected input [..., ", K, "], got ",
                  x.defined() ? x.desc() : "undefined");
  NXD_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16,
            "[int8_linear] input must be f32 or bf16, got ", x.desc());
  NXD_CHECK(!x.is_meta(), "[int8_linear] input is a meta tensor: ", x.desc());
  NXD_CHECK(!(GradMode::is_enabled() && x.requires_grad()),
            "[int8_linear] an int8 weight is for inference: the input requires a gradient");
  NXD_CHECK(active_recorder() == nullptr,
            "[int8_linear] an int8-quantized layer cannot be traced (run it eagerly)");
  NXD_CHECK_SHAPE(!bias.defined() || (bias.dim() == 1 && bias.size(0) == N),
                  "[int8_linear] bias must be [", N, "], got ", bias.desc());
  const Tensor xf = x.detach().to(DType::f32).contiguous();
  const int64_t M = xf.numel() / K;
  Shape out_shape = x.shape();
  out_shape.back() = N;
  Tensor y = empty(out_shape, DType::f32);
  float* yp = y.data<float>();
  kernels::linear_int8(yp, xf.data<float>(), w.values(), w.scales(), M, N, K);
  if (bias.defined()) {
    const Tensor bf = bias.detach().to(DType::f32).contiguous();
    const float* b = bf.data<float>();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) yp[i * N + j] += b[j];
  }
  return x.dtype() == DType::f32 ? y : y.to(x.dtype());
}

Tensor QuantizableLinear::weight_product(const Tensor& x, const Tensor& w, const Tensor& b) const {
  return int8_ ? int8_linear(x, *int8_, b) : linear(x, w, b);
}

namespace {

bool skipped(const std::string& name, const std::vector<std::string>& skip) {
  for (const std::string& s : skip)
    if (name == s || name.rfind(s + ".", 0) == 0) return true;
  return false;
}

std::string joined(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace

QuantizeSummary quantize_linear_layers(Module& model, const QuantizeOptions& opts) {
  NXD_CHECK(opts.format == WeightQuant::int8, "[quantize] format ", weight_quant_name(opts.format),
            " quantizes nothing");
  // First every check, then the change: a refused model is left as it was.
  struct Todo {
    QuantizableLinear* layer;
    Tensor weight;
    Communicator* whole_rows_over;  // row parallel: the TP group
  };
  std::vector<Todo> todo;
  std::set<const void*> owned;  // the storage of the weights the layers own
  std::vector<std::pair<std::string, Module*>> modules = model.named_modules();
  for (auto& [name, m] : modules) {
    if (skipped(name, opts.skip)) continue;
    auto* q = dynamic_cast<QuantizableLinear*>(m);
    if (!q) continue;
    Tensor w;
    for (auto& [n, t] : m->named_parameters(/*recurse=*/false))
      if (n == "weight") w = t;
    NXD_CHECK(w.defined(), "[quantize] ", name, " (", m->type_name(),
              ") has no parameter 'weight'");
    const auto* pm = dynamic_cast<const ParallelModule*>(m);
    const ParallelAttrs* attrs = pm ? pm->parallel_attrs("weight") : nullptr;
    Communicator* rows_over = nullptr;
    if (attrs && attrs->tensor_model_parallel && attrs->partition_dim == 1) {
      const auto* row = dynamic_cast<const ParallelLinearBase*>(m);
      NXD_CHECK(row, "[quantize] ", joined(name, "weight"), " (", m->type_name(),
                ") is split along its input over TP without a TP group to find its rows' scales");
      rows_over = &row->group();
    }
    NXD_CHECK(w.dim() == 2 || (w.dim() == 3 && !rows_over), "[quantize] ", joined(name, "weight"),
              " is ", w.desc(), ", not a [out, in] matrix");
    todo.push_back({q, w, rows_over});
    owned.insert(w.raw_data());
  }
  for (auto& [name, m] : modules) {
    if (skipped(name, opts.skip) || dynamic_cast<QuantizableLinear*>(m)) continue;
    const bool embedding = m->type_name().find("Embedding") != std::string::npos;
    for (auto& [n, t] : m->named_parameters(/*recurse=*/false))
      NXD_CHECK(embedding || t.dim() != 2 || owned.count(t.raw_data()), "[quantize] ",
                joined(name, n), " (", t.desc(), ", in ", m->type_name(),
                ") is a matrix that int8 weight quantization does not cover");
  }
  QuantizeSummary s;
  for (auto& [q, w, rows_over] : todo) {
    auto iw = Int8Weight::quantize(w, rows_over);
    ++s.layers;
    s.weights += w.numel();
    s.bytes_before += w.numel() * dtype_size(w.dtype());
    s.bytes_after += iw->bytes();
    q->set_int8_weight(std::move(iw));
  }
  return s;
}

}  // namespace nxd
