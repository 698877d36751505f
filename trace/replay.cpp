#include "nxd/trace/replay.h"

#include <map>
#include <memory>
#include <mutex>

#include "nxd/autograd/ops.h"
#include "nxd/autograd/ops/inference.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/parallel/mappings.h"
#include "nxd/layers/quantize.h"
#include "nxd/trace/fuse.h"

namespace nxd::trace {

namespace {

using V = std::vector<Tensor>;

ReplayFn unary(Tensor (*f)(const Tensor&)) {
  return [f](const V& in, const OpAttrs&) { return V{f(in[0])}; };
}
ReplayFn binary(Tensor (*f)(const Tensor&, const Tensor&)) {
  return [f](const V& in, const OpAttrs&) { return V{f(in[0], in[1])}; };
}

void add_elementwise(std::map<std::string, OpInfo>& m) {
  m["add"] = {binary(&add)};
  m["sub"] = {binary(&sub)};
  m["mul"] = {binary(&mul)};
  m["div"] = {binary(&div)};
  m["add_scalar"] = {[](const V& in, const OpAttrs& a) { return V{add(in[0], a.f("s"))}; }};
  m["mul_scalar"] = {[](const V& in, const OpAttrs& a) { return V{mul(in[0], a.f("s"))}; }};
  m["neg"] = {unary(&neg)};
  m["exp"] = {unary(&exp)};
  m["log"] = {unary(&log)};
  m["sqrt"] = {unary(&sqrt)};
  m["rsqrt"] = {unary(&rsqrt)};
  m["tanh"] = {unary(&tanh)};
  m["sigmoid"] = {unary(&sigmoid)};
  m["relu"] = {unary(&relu)};
  m["square"] = {unary(&square)};
  m["abs"] = {unary(&abs)};
  m["silu"] = {unary(&silu)};
  m["swiglu"] = {binary(&swiglu)};
  m["pow"] = {[](const V& in, const OpAttrs& a) { return V{pow(in[0], a.f("exponent"))}; }};
  m["gelu"] = {[](const V& in, const OpAttrs& a) {
    return V{gelu(in[0], static_cast<GeluApprox>(a.i("approx")))};
  }};
}

void add_reductions(std::map<std::string, OpInfo>& m) {
  m["sum"] = {[](const V& in, const OpAttrs& a) {
    return V{sum(in[0], a.ints("dims"), a.i("keepdim") != 0)};
  }};
  m["mean"] = {[](const V& in, const OpAttrs& a) {
    return V{mean(in[0], a.ints("dims"), a.i("keepdim") != 0)};
  }};
  m["amax"] = {[](const V& in, const OpAttrs& a) {
    return V{amax(in[0], a.i("dim"), a.i("keepdim") != 0)};
  }};
  m["sum_to"] = {[](const V& in, const OpAttrs& a) { return V{sum_to(in[0], a.ints("shape"))}; }};
  m["softmax"] = {[](const V& in, const OpAttrs& a) { return V{softmax(in[0], a.i("dim"))}; }};
  m["log_softmax"] = {
      [](const V& in, const OpAttrs& a) { return V{log_softmax(in[0], a.i("dim"))}; }};
}

void add_shapes(std::map<std::string, OpInfo>& m) {
  m["view"] = {[](const V& in, const OpAttrs& a) { return V{view(in[0], a.ints("shape"))}; }};
  m["reshape"] = {[](const V& in, const OpAttrs& a) { return V{reshape(in[0], a.ints("shape"))}; }};
  m["expand"] = {[](const V& in, const OpAttrs& a) { return V{expand(in[0], a.ints("shape"))}; }};
  m["squeeze"] = {[](const V& in, const OpAttrs& a) { return V{squeeze(in[0], a.i("dim"))}; }};
  m["unsqueeze"] = {[](const V& in, const OpAttrs& a) { return V{unsqueeze(in[0], a.i("dim"))}; }};
  m["flatten"] = {[](const V& in, const OpAttrs& a) {
    return V{flatten(in[0], a.i("start_dim"), a.i("end_dim"))};
  }};
  m["transpose"] = {
      [](const V& in, const OpAttrs& a) { return V{transpose(in[0], a.i("a"), a.i("b"))}; }};
  m["permute"] = {[](const V& in, const OpAttrs& a) { return V{permute(in[0], a.ints("dims"))}; }};
  m["narrow"] = {[](const V& in, const OpAttrs& a) {
    return V{narrow(in[0], a.i("dim"), a.i("start"), a.i("length"))};
  }};
  m["slice"] = {[](const V& in, const OpAttrs& a) {
    return V{slice(in[0], a.i("dim"), a.i("start"), a.i("end"), a.i("step"))};
  }};
  m["select"] = {
      [](const V& in, const OpAttrs& a) { return V{select(in[0], a.i("dim"), a.i("index"))}; }};
  m["contiguous"] = {unary(&contiguous)};
  m["clone"] = {unary(&clone)};
  m["to"] = {
      [](const V& in, const OpAttrs& a) { return V{to(in[0], static_cast<DType>(a.i("dtype")))}; }};
  m["cat"] = {[](const V& in, const OpAttrs& a) { return V{cat(in, a.i("dim"))}; }};
  m["stack"] = {[](const V& in, const OpAttrs& a) { return V{stack(in, a.i("dim"))}; }};
  m["chunk"] = {
      [](const V& in, const OpAttrs& a) { return chunk(in[0], a.i("chunks"), a.i("dim")); }};
  m["split"] = {
      [](const V& in, const OpAttrs& a) { return split(in[0], a.ints("sizes"), a.i("dim")); }};
}

void add_nn(std::map<std::string, OpInfo>& m) {
  m["matmul"] = {binary(&matmul)};
  m["linear"] = {[](const V& in, const OpAttrs&) { return V{linear(in[0], in[1], in[2])}; }};
  m["embedding"] = {binary(&embedding)};
  m["layer_norm"] = {
      [](const V& in, const OpAttrs& a) { return V{layer_norm(in[0], in[1], in[2], a.f("eps"))}; }};
  m["rms_norm"] = {
      [](const V& in, const OpAttrs& a) { return V{rms_norm(in[0], in[1], a.f("eps"))}; }};
  m["rotary"] = {
      [](const V& in, const OpAttrs& a) { return V{rotary(in[0], rotary_options_from(a))}; }};
  m["sdpa"] = {[](const V& in, const OpAttrs& a) {
    SdpaOptions o;
    o.causal = a.i("causal") != 0;
    o.scale = a.f("scale");
    o.impl = static_cast<AttentionImpl>(a.i("impl"));
    o.window = a.has("window") ? a.i("window") : 0;
    return V{scaled_dot_product_attention(in[0], in[1], in[2], o)};
  }};
  m["dropout"] = {[](const V& in, const OpAttrs& a) {
    NXD_CHECK(a.i("training") == 0 || a.f("p") == 0.0,
              "[trace] dropout in training mode cannot be replayed (p=", a.f("p"),
              "): trace the model in eval mode");
    return V{in[0]};
  }};
}

void add_parallel(std::map<std::string, OpInfo>& m) {
  m["tp_copy"] = {unary(&copy_to_tensor_model_parallel_region)};
  m["tp_all_reduce"] = {unary(&reduce_from_tensor_model_parallel_region)};
  m["tp_scatter"] = {unary(&scatter_to_tensor_model_parallel_region)};
  m["tp_all_gather"] = {unary(&gather_from_tensor_model_parallel_region)};
  m["sp_scatter"] = {[](const V& in, const OpAttrs& a) {
    return V{scatter_to_sequence_parallel_region(in[0], a.i("dim"))};
  }};
  m["sp_all_gather"] = {[](const V& in, const OpAttrs& a) {
    return V{
        gather_from_sequence_parallel_region(in[0], a.i("dim"), a.i("to_model_parallel") != 0)};
  }};
  m["sp_reduce_scatter"] = {[](const V& in, const OpAttrs& a) {
    return V{reduce_scatter_to_sequence_parallel_region(in[0], a.i("dim"))};
  }};
  m["vocab_parallel_lookup"] = {[](const V& in, const OpAttrs& a) {
    return V{vocab_parallel_lookup(in[0], in[1], a.i("num"), a.i("start"))};
  }};
}

void add_inference(std::map<std::string, OpInfo>& m) {
  OpInfo write;
  write.fn = [](const V& in, const OpAttrs&) {
    kv_cache_write(in[0], in[1], in[2], in[3], in[4]);
    return V{};
  };
  write.effect = true;
  m["kv_cache_write"] = write;
  m["rotary_at"] = {[](const V& in, const OpAttrs& a) {
    return V{rotary_at(in[0], in[1], rotary_options_from(a))};
  }};
  m["cached_attention"] = {[](const V& in, const OpAttrs& a) {
    return V{cached_attention(in[0], in[1], in[2], in[3], in[4], in[5], a.f("scale"),
                              a.has("window") ? a.i("window") : 0)};
  }};
  m["gather_last"] = {binary(&gather_last)};
  // quantized layers (layers/quantize.h): the eager kernels on the graph's quantized parameters
  m["int8_linear"] = {[](const V& in, const OpAttrs& a) {
    return V{int8_linear_parts(in[0], in[1], in[2], in[3], a.i("out"), a.i("in"))};
  }};
  m["int4_linear"] = {[](const V& in, const OpAttrs& a) {
    NXD_CHECK(a.i("zero") == 0 || a.i("zero") == 1, "[trace] int4_linear: zero ", a.i("zero"),
              " is neither symmetric (0) nor asymmetric (1)");
    const int64_t act = a.has("act") ? a.i("act") : 0;  // graphs saved before the mode: f32
    NXD_CHECK(act == 0 || act == 1, "[trace] int4_linear: act ", act,
              " is neither f32 (0) nor int8_blocks (1)");
    const kernels::Int4Layout l{.n = a.i("n"),
                                .k = a.i("k"),
                                .group = a.i("group"),
                                .zero = static_cast<kernels::Int4Zero>(a.i("zero")),
                                .act = static_cast<kernels::Int4Activations>(act)};
    return V{int4_linear_parts(in[0], in[1], in[2], in[3], in[4], l)};
  }};
  m["linear_add"] = {
      [](const V& in, const OpAttrs&) { return V{linear_add(in[0], in[1], in[2], in[3])}; }};
}

struct Registry {
  std::mutex mu;
  std::map<std::string, OpInfo> ops;  // node-stable: entries are never erased
  Registry() {
    add_elementwise(ops);
    add_reductions(ops);
    add_shapes(ops);
    add_nn(ops);
    add_parallel(ops);
    add_inference(ops);
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_op(const std::string& name, OpInfo info) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.ops[name] = std::move(info);
}

const OpInfo* find_op(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.ops.find(name);
  return it == r.ops.end() ? nullptr : &it->second;
}

bool op_has_effect(const std::string& name) {
  const OpInfo* i = find_op(name);
  return i && i->effect;
}

}  // namespace nxd::trace
