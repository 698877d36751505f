#include "nxd/layers/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "nxd/autograd/ops.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/runtime/kernels/gemv_int8.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

const char* weight_quant_name(WeightQuant q) {
  return q == WeightQuant::int8 ? "int8" : q == WeightQuant::int4 ? "int4" : "none";
}

WeightQuant weight_quant_from_name(const std::string& name) {
  if (name == "none") return WeightQuant::none;
  if (name == "int8") return WeightQuant::int8;
  if (name == "int4") return WeightQuant::int4;
  throw ConfigError(str("[quantize] unknown weight format '", name, "' (known: none, int8, int4)"));
}

QuantizeOptions parse_weight_quant(const std::string& spec) {
  const std::string bad = str("unknown weight format '", spec.substr(0, 64),
                              "' (known: int8, int4[:32|:64|:128][:sym|:asym], e.g. int4:64:asym)");
  QuantizeOptions o;
  if (spec == "int8") return o;
  if (spec.rfind("int4", 0) != 0) throw ConfigError(bad);
  o.format = WeightQuant::int4;
  std::string rest = spec.substr(4);
  bool have_group = false, have_zero = false;
  while (!rest.empty()) {
    if (rest[0] != ':') throw ConfigError(bad);
    const size_t end = rest.find(':', 1);
    const std::string part = rest.substr(1, end == std::string::npos ? end : end - 1);
    rest = end == std::string::npos ? "" : rest.substr(end);
    if ((part == "sym" || part == "asym") && !have_zero) {
      o.zero = part == "sym" ? kernels::Int4Zero::symmetric : kernels::Int4Zero::asymmetric;
      have_zero = true;
    } else if ((part == "32" || part == "64" || part == "128") && !have_group && !have_zero) {
      o.group = std::stoll(part);
      have_group = true;
    } else {
      throw ConfigError(bad);
    }
  }
  return o;
}

std::string describe(const QuantizeOptions& o) {
  if (o.format != WeightQuant::int4) return weight_quant_name(o.format);
  return str("int4 (groups of ", o.group, ", ",
             o.zero == kernels::Int4Zero::symmetric ? "symmetric" : "asymmetric", ")");
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

namespace {
void check_scales(const char* what, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    NXD_CHECK(std::isfinite(v[i]), "[quantize] ", what, " ", i, " is ", v[i], " (not finite)");
}
}  // namespace

std::shared_ptr<const Int8Weight> Int8Weight::from_parts(int64_t out, int64_t in,
                                                         std::vector<int8_t> q,
                                                         std::vector<float> scale) {
  NXD_CHECK(out > 0 && in > 0 && static_cast<int64_t>(q.size()) == out * in &&
                static_cast<int64_t>(scale.size()) == out,
            "[quantize] an int8 weight [", out, ", ", in, "] needs ", out * in, " values and ", out,
            " scales, got ", q.size(), " and ", scale.size());
  check_scales("int8 scale", scale);
  for (size_t i = 0; i < scale.size(); ++i)
    NXD_CHECK(scale[i] >= 0, "[quantize] int8 scale ", i, " is negative: ", scale[i]);
  auto r = std::make_shared<Int8Weight>();
  r->out_ = out, r->in_ = in, r->q_ = std::move(q), r->scale_ = std::move(scale);
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

namespace {

// y = x @ W^T + bias for a quantized W [N, K] whose product `mul(c, x, M)` writes c [M, N].
template <class Mul>
Tensor quantized_linear(const char* op, const char* format, const Tensor& x, int64_t N, int64_t K,
                        const Tensor& bias, Mul&& mul) {
  NXD_CHECK_SHAPE(x.defined() && x.dim() >= 1 && x.size(-1) == K, "[", op,
                  "] expected input [..., ", K, "], got ", x.defined() ? x.desc() : "undefined");
  NXD_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, "[", op,
            "] input must be f32 or bf16, got ", x.desc());
  NXD_CHECK(!x.is_meta(), "[", op, "] input is a meta tensor: ", x.desc());
  NXD_CHECK(!(GradMode::is_enabled() && x.requires_grad()), "[", op, "] an ", format,
            " weight is for inference: the input requires a gradient");
  NXD_CHECK(active_recorder() == nullptr, "[", op, "] an ", format,
            "-quantized layer cannot be traced (run it eagerly)");
  NXD_CHECK_SHAPE(!bias.defined() || (bias.dim() == 1 && bias.size(0) == N), "[", op,
                  "] bias must be [", N, "], got ", bias.desc());
  const Tensor xf = x.detach().to(DType::f32).contiguous();
  const int64_t M = xf.numel() / K;
  Shape out_shape = x.shape();
  out_shape.back() = N;
  Tensor y = empty(out_shape, DType::f32);
  float* yp = y.data<float>();
  mul(yp, xf.data<float>(), M);
  if (bias.defined()) {
    const Tensor bf = bias.detach().to(DType::f32).contiguous();
    const float* b = bf.data<float>();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) yp[i * N + j] += b[j];
  }
  return x.dtype() == DType::f32 ? y : y.to(x.dtype());
}

}  // namespace

Tensor int8_linear(const Tensor& x, const Int8Weight& w, const Tensor& bias) {
  const int64_t K = w.in_features(), N = w.out_features();
  return quantized_linear("int8_linear", "int8", x, N, K, bias,
                          [&](float* c, const float* xp, int64_t M) {
                            kernels::linear_int8(c, xp, w.values(), w.scales(), M, N, K);
                          });
}

Tensor int4_linear(const Tensor& x, const Int4Weight& w, const Tensor& bias) {
  return quantized_linear("int4_linear", "int4", x, w.out_features(), w.in_features(), bias,
                          [&](float* c, const float* xp, int64_t M) {
                            kernels::linear_int4(c, xp, w.values(), w.scales(), w.mins(),
                                                 w.layout(), M);
                          });
}

std::shared_ptr<const Int4Weight> Int4Weight::from_parts(const kernels::Int4Layout& l,
                                                         std::vector<uint8_t> q,
                                                         std::vector<float> scale,
                                                         std::vector<float> min) {
  l.check("quantize");
  const bool asym = l.zero == kernels::Int4Zero::asymmetric;
  NXD_CHECK(static_cast<int64_t>(q.size()) == l.value_bytes() &&
                static_cast<int64_t>(scale.size()) == l.groups() &&
                static_cast<int64_t>(min.size()) == (asym ? l.groups() : 0),
            "[quantize] an int4 weight [", l.n, ", ", l.k, "] in groups of ", l.group, " needs ",
            l.value_bytes(), " value bytes, ", l.groups(), " scales and ", asym ? l.groups() : 0,
            " minimums, got ", q.size(), ", ", scale.size(), " and ", min.size());
  check_scales("int4 scale", scale);
  check_scales("int4 minimum", min);
  auto r = std::make_shared<Int4Weight>();
  r->l_ = l, r->q_ = std::move(q), r->scale_ = std::move(scale), r->min_ = std::move(min);
  return r;
}

std::shared_ptr<const Int4Weight> Int4Weight::quantize(const Tensor& w, int64_t group,
                                                       kernels::Int4Zero zero) {
  NXD_CHECK(w.defined() && (w.dim() == 2 || w.dim() == 3) && !w.is_meta() &&
                (w.dtype() == DType::f32 || w.dtype() == DType::bf16),
            "[quantize] int4 needs a host f32 or bf16 weight [out, in], got ",
            w.defined() ? w.desc() : "undefined");
  NoGradGuard no_grad;
  const Tensor wf = w.detach().to(DType::f32).contiguous();
  auto r = std::make_shared<Int4Weight>();
  r->l_.k = w.size(-1);
  r->l_.n = w.numel() / r->l_.k;
  r->l_.group = group;
  r->l_.zero = zero;
  r->l_.check("quantize");
  r->q_.resize(static_cast<size_t>(r->l_.value_bytes()));
  r->scale_.resize(static_cast<size_t>(r->l_.groups()));
  if (zero == kernels::Int4Zero::asymmetric) r->min_.resize(r->scale_.size());
  kernels::quantize_int4(r->q_.data(), r->scale_.data(), r->min_.empty() ? nullptr : r->min_.data(),
                         wf.data<float>(), r->l_);
  return r;
}

Tensor Int4Weight::dequantize() const {
  Tensor w = empty({l_.n, l_.k}, DType::f32);
  kernels::dequantize_int4_rows(w.data<float>(), q_.data(), scale_.data(), mins(), l_, 0, l_.n);
  return w;
}

Tensor QuantizableLinear::weight_product(const Tensor& x, const Tensor& w, const Tensor& b) const {
  if (int8_) return int8_linear(x, *int8_, b);
  if (int4_) return int4_linear(x, *int4_, b);
  return linear(x, w, b);
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
  NXD_CHECK(opts.format != WeightQuant::none, "[quantize] format ", weight_quant_name(opts.format),
            " quantizes nothing");
  const bool int4 = opts.format == WeightQuant::int4;
  if (int4) (kernels::Int4Layout{.n = 1, .k = 1, .group = opts.group}).check("quantize");
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
    NXD_CHECK(!int4 || !rows_over || rows_over->size() == 1 || w.size(-1) % opts.group == 0,
              "[quantize] ", joined(name, "weight"), " is split along its ", w.size(-1),
              " inputs per rank, not a multiple of the int4 group ", opts.group,
              ": a group would cross ranks (use a group that divides it, or a smaller TP)");
    todo.push_back({q, w, rows_over});
    owned.insert(w.raw_data());
  }
  for (auto& [name, m] : modules) {
    if (skipped(name, opts.skip) || dynamic_cast<QuantizableLinear*>(m)) continue;
    const bool embedding = m->type_name().find("Embedding") != std::string::npos;
    for (auto& [n, t] : m->named_parameters(/*recurse=*/false))
      NXD_CHECK(embedding || t.dim() != 2 || owned.count(t.raw_data()), "[quantize] ",
                joined(name, n), " (", t.desc(), ", in ", m->type_name(), ") is a matrix that ",
                weight_quant_name(opts.format), " weight quantization does not cover");
  }
  // Storages another module's tensor shares (a tied weight): those stay allocated.
  std::set<const void*> shared;
  for (auto& [name, m] : modules)
    if (skipped(name, opts.skip) || !dynamic_cast<QuantizableLinear*>(m))
      for (auto& [n, t] : m->named_parameters(/*recurse=*/false))
        if (!t.is_meta()) shared.insert(t.raw_data());
  QuantizeSummary s;
  for (auto& [q, w, rows_over] : todo) {
    ++s.layers;
    s.weights += w.numel();
    s.bytes_before += w.numel() * dtype_size(w.dtype());
    if (int4) {
      auto iw = Int4Weight::quantize(w, opts.group, opts.zero);
      s.bytes_after += iw->bytes();
      q->set_int4_weight(std::move(iw));
    } else {
      auto iw = Int8Weight::quantize(w, rows_over);
      s.bytes_after += iw->bytes();
      q->set_int8_weight(std::move(iw));
    }
    if (!shared.count(w.raw_data())) release_quantized_weight(w);
  }
  return s;
}

void release_quantized_weight(const Tensor& w) {
  NXD_CHECK(w.defined(), "[quantize] release_quantized_weight of an undefined tensor");
  if (w.is_meta()) return;
  TensorImpl& impl = *w.impl();
  impl.storage = Storage::allocate(w.numel() * dtype_size(w.dtype()), Device::meta);
  impl.strides = contiguous_strides(impl.shape);
  impl.offset = 0;
}

void check_no_quantized_layers(const Module& model, const std::string& what) {
  for (auto& [name, m] : const_cast<Module&>(model).named_modules()) {  // read only
    const auto* q = dynamic_cast<const QuantizableLinear*>(m);
    if (!q || !q->quantized()) continue;
    throw InvalidArgument(
        str("[", what, "] ", name.empty() ? m->type_name() : name, " is ",
            q->int8_weight() ? "int8" : "int4", "-quantized: its unquantized weight was freed at ",
            "quantization, and ", what,
            " needs it (load the unquantized weights; a quantized checkpoint is written by "
            "nxd-ckpt quantize)"));
  }
}

WeightBytes resident_weight_bytes(const Module& model) {
  WeightBytes b;
  std::set<const void*> seen;
  auto count = [&](const Tensor& t) {
    if (t.defined() && !t.is_meta() && seen.insert(t.storage().get()).second)
      b.dense += t.storage()->nbytes();
  };
  for (auto& [n, t] : model.named_parameters()) count(t);
  for (auto& [n, t] : model.named_buffers()) count(t);
  for (auto& [name, m] : const_cast<Module&>(model).named_modules())  // read only
    if (const auto* q = dynamic_cast<const QuantizableLinear*>(m))
      b.quantized += q->int8_weight()   ? q->int8_weight()->bytes()
                     : q->int4_weight() ? q->int4_weight()->bytes()
                                        : 0;
  return b;
}

}  // namespace nxd
