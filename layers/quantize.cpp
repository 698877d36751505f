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
  const std::string bad =
      str("unknown weight format '", spec.substr(0, 64),
          "' (known: int8 or int4[:32|:64|:128][:sym|:asym][:q8], then optionally :head or "
          ":head=int8|int4, e.g. int4:64:asym, int4:32:q8, int8:head)");
  QuantizeOptions o;
  std::string rest;
  if (spec.rfind("int8", 0) == 0) {
    rest = spec.substr(4);
  } else if (spec.rfind("int4", 0) == 0) {
    o.format = WeightQuant::int4;
    rest = spec.substr(4);
  } else {
    throw ConfigError(bad);
  }
  bool have_group = false, have_zero = false, have_head = false, have_act = false;
  while (!rest.empty()) {
    if (rest[0] != ':') throw ConfigError(bad);
    const size_t end = rest.find(':', 1);
    const std::string part = rest.substr(1, end == std::string::npos ? end : end - 1);
    rest = end == std::string::npos ? "" : rest.substr(end);
    const bool int4 = o.format == WeightQuant::int4;
    if (have_head) throw ConfigError(bad);  // the head comes last
    if (part == "head" || part == "head=int8" || part == "head=int4") {
      o.head = part == "head=int4" ? WeightQuant::int4 : WeightQuant::int8;
      have_head = true;
    } else if (int4 && part == "q8" && !have_act) {
      o.act = kernels::Int4Activations::int8_blocks;
      have_act = true;
    } else if (int4 && (part == "sym" || part == "asym") && !have_zero && !have_act) {
      o.zero = part == "sym" ? kernels::Int4Zero::symmetric : kernels::Int4Zero::asymmetric;
      have_zero = true;
    } else if (int4 && (part == "32" || part == "64" || part == "128") && !have_group &&
               !have_zero && !have_act) {
      o.group = std::stoll(part);
      have_group = true;
    } else {
      throw ConfigError(bad);
    }
  }
  return o;
}

QuantizeOptions with_format(const QuantizeOptions& opts, WeightQuant f) {
  QuantizeOptions o = opts;
  o.format = f;
  o.head = WeightQuant::none;
  return o;
}

std::string describe(const QuantizeOptions& o) {
  std::string d =
      o.format != WeightQuant::int4
          ? std::string(weight_quant_name(o.format))
          : str("int4 (groups of ", o.group, ", ",
                o.zero == kernels::Int4Zero::symmetric ? "symmetric" : "asymmetric",
                o.act == kernels::Int4Activations::int8_blocks ? ", int8 activations" : "", ")");
  if (o.head == WeightQuant::int8) d += ", head int8";
  if (o.head == WeightQuant::int4)
    d += o.format == WeightQuant::int4 ? ", head int4"
                                       : ", head " + describe(with_format(o, WeightQuant::int4));
  return d;
}

namespace {
// Zeroed i32 words holding `bytes` bytes (the last word padded): a quantized weight's values.
Tensor byte_words(int64_t bytes) {
  return zeros({(bytes + 3) / 4}, DType::i32);
}

template <class T>
Tensor bytes_tensor(const std::vector<T>& v) {
  Tensor t = byte_words(static_cast<int64_t>(v.size() * sizeof(T)));
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(T));
  return t;
}

Tensor f32_tensor(const std::vector<float>& v) {
  Tensor t = empty({static_cast<int64_t>(v.size())}, DType::f32);
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * 4);
  return t;
}
}  // namespace

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
  r->q_ = byte_words(r->out_ * r->in_);
  r->scale_ = empty({r->out_}, DType::f32);
  float* scale = r->scale_.data<float>();
  kernels::int8_row_scales(scale, wf.data<float>(), r->out_, r->in_);
  if (whole_rows_over && whole_rows_over->size() > 1)
    whole_rows_over->all_reduce(scale, scale, r->out_, DType::f32, ReduceOp::max);
  kernels::quantize_int8_with_scales(static_cast<int8_t*>(r->q_.raw_data()), scale,
                                     wf.data<float>(), r->out_, r->in_);
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
  r->out_ = out, r->in_ = in, r->q_ = bytes_tensor(q), r->scale_ = f32_tensor(scale);
  return r;
}

Tensor Int8Weight::dequantize() const {
  Tensor w = empty({out_, in_}, DType::f32);
  float* p = w.data<float>();
  const int8_t* q = values();
  const float* scale = scales();
  for (int64_t i = 0; i < out_; ++i)
    for (int64_t j = 0; j < in_; ++j)
      p[i * in_ + j] = static_cast<float>(q[i * in_ + j]) * scale[i];
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

// q holds `bytes` bytes in i32 words; t is f32 with n elements.
void check_words(const char* op, const Tensor& q, int64_t bytes) {
  NXD_CHECK(q.defined() && q.dtype() == DType::i32 && q.dim() == 1 && q.is_contiguous() &&
                q.numel() == (bytes + 3) / 4,
            "[", op, "] the quantized values must be i32 [", (bytes + 3) / 4, "] (", bytes,
            " bytes), got ", q.defined() ? q.desc() : "undefined");
}
void check_f32(const char* op, const char* what, const Tensor& t, int64_t n) {
  NXD_CHECK(
      t.defined() && t.dtype() == DType::f32 && t.dim() == 1 && t.is_contiguous() && t.numel() == n,
      "[", op, "] ", what, " must be f32 [", n, "], got ", t.defined() ? t.desc() : "undefined");
}

}  // namespace

Tensor int8_linear_parts(const Tensor& x, const Tensor& q, const Tensor& scales, const Tensor& bias,
                         int64_t out, int64_t in) {
  const char* op = "int8_linear";
  OpScope scope(op);  // the checks and the kernel run inside the one recorded op
  check_words(op, q, out * in);
  check_f32(op, "the scales", scales, out);
  const Tensor y =
      quantized_linear(op, "int8", x, out, in, bias, [&](float* c, const float* xp, int64_t M) {
        kernels::linear_int8(c, xp, static_cast<const int8_t*>(q.raw_data()), scales.data<float>(),
                             M, out, in);
      });
  return scope.out(y, [&] {
    return OpCall{{x, q, scales, bias}, OpAttrs().set("out", out).set("in", in)};
  });
}

Tensor int8_linear(const Tensor& x, const Int8Weight& w, const Tensor& bias) {
  return int8_linear_parts(x, w.values_tensor(), w.scales_tensor(), bias, w.out_features(),
                           w.in_features());
}

Tensor int4_linear_parts(const Tensor& x, const Tensor& q, const Tensor& scales, const Tensor& mins,
                         const Tensor& bias, const kernels::Int4Layout& l) {
  const char* op = "int4_linear";
  OpScope scope(op);  // the checks and the kernel run inside the one recorded op
  l.check(op);
  check_words(op, q, l.value_bytes());
  check_f32(op, "the scales", scales, l.groups());
  const bool asym = l.zero == kernels::Int4Zero::asymmetric;
  if (asym) check_f32(op, "the minimums", mins, l.groups());
  NXD_CHECK(asym || !mins.defined(), "[", op, "] a symmetric weight has no minimums, got ",
            mins.desc());
  const Tensor y =
      quantized_linear(op, "int4", x, l.n, l.k, bias, [&](float* c, const float* xp, int64_t M) {
        kernels::linear_int4(c, xp, static_cast<const uint8_t*>(q.raw_data()), scales.data<float>(),
                             asym ? mins.data<float>() : nullptr, l, M);
      });
  return scope.out(y, [&] {
    return OpCall{{x, q, scales, mins, bias},
                  OpAttrs()
                      .set("n", l.n)
                      .set("k", l.k)
                      .set("group", l.group)
                      .set("zero", static_cast<int64_t>(l.zero))
                      .set("act", static_cast<int64_t>(l.act))};
  });
}

Tensor int4_linear(const Tensor& x, const Int4Weight& w, const Tensor& bias) {
  return int4_linear_parts(x, w.values_tensor(), w.scales_tensor(), w.mins_tensor(), bias,
                           w.layout());
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
  r->l_ = l, r->q_ = bytes_tensor(q), r->scale_ = f32_tensor(scale);
  if (asym) r->min_ = f32_tensor(min);
  return r;
}

std::shared_ptr<const Int4Weight> Int4Weight::quantize(const Tensor& w, int64_t group,
                                                       kernels::Int4Zero zero,
                                                       kernels::Int4Activations act) {
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
  r->l_.act = act;
  r->l_.check("quantize");
  r->q_ = byte_words(r->l_.value_bytes());
  r->scale_ = empty({r->l_.groups()}, DType::f32);
  if (zero == kernels::Int4Zero::asymmetric) r->min_ = empty({r->l_.groups()}, DType::f32);
  kernels::quantize_int4(static_cast<uint8_t*>(r->q_.raw_data()), r->scale_.data<float>(),
                         r->min_.defined() ? r->min_.data<float>() : nullptr, wf.data<float>(),
                         r->l_);
  return r;
}

Tensor Int4Weight::dequantize() const {
  Tensor w = empty({l_.n, l_.k}, DType::f32);
  kernels::dequantize_int4_rows(w.data<float>(), values(), scales(), mins(), l_, 0, l_.n);
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
    s.bytes_after += set_quantized_weight(*q, w, opts, rows_over);
    if (!shared.count(w.raw_data())) release_quantized_weight(w);
  }
  return s;
}

int64_t set_quantized_weight(QuantizableLinear& layer, const Tensor& w, const QuantizeOptions& opts,
                             Communicator* whole_rows_over) {
  if (opts.format == WeightQuant::int4) {
    auto iw = Int4Weight::quantize(w, opts.group, opts.zero, opts.act);
    const int64_t b = iw->bytes();
    layer.set_int4_weight(std::move(iw));
    return b;
  }
  NXD_CHECK(opts.format == WeightQuant::int8, "[quantize] format ", weight_quant_name(opts.format),
            " quantizes nothing");
  auto iw = Int8Weight::quantize(w, whole_rows_over);
  const int64_t b = iw->bytes();
  layer.set_int8_weight(std::move(iw));
  return b;
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

namespace {

// fn(name, layer) for every quantized layer of `model`: its QuantizableLinear modules, then the
// weights a QuantizedWeightOwner holds itself, in module order.
template <class F>
void for_each_quantized(const Module& model, F&& fn) {
  for (auto& [name, m] : const_cast<Module&>(model).named_modules()) {  // read only
    if (const auto* q = dynamic_cast<const QuantizableLinear*>(m); q && q->quantized())
      fn(name, *q);
    if (const auto* o = dynamic_cast<const QuantizedWeightOwner*>(m))
      for (const auto& [own, q] : o->owned_quantized())
        if (q && q->quantized()) fn(joined(name, own), *q);
  }
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> quantized_tensors(Module& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  for_each_quantized(model, [&](const std::string& name, const QuantizableLinear& q) {
    const std::string pre = name.empty() ? "" : name + ".";
    if (const auto& w = q.int8_weight()) {
      out.emplace_back(pre + "qweight", w->values_tensor());
      out.emplace_back(pre + "scales", w->scales_tensor());
    } else {
      const auto& w4 = *q.int4_weight();
      out.emplace_back(pre + "qweight", w4.values_tensor());
      out.emplace_back(pre + "scales", w4.scales_tensor());
      if (w4.mins_tensor().defined()) out.emplace_back(pre + "mins", w4.mins_tensor());
    }
  });
  return out;
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
  for_each_quantized(model, [&](const std::string&, const QuantizableLinear& q) {
    b.quantized += q.int8_weight() ? q.int8_weight()->bytes() : q.int4_weight()->bytes();
  });
  return b;
}

}  // namespace nxd
