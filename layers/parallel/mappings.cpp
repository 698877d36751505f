#include "nxd/layers/parallel/mappings.h"

#include "nxd/autograd/function.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

namespace tp_detail {

void check_divisible(const char* op, const char* what, int64_t n, int tp) {
  NXD_CHECK_SHAPE(n % tp == 0, "[", op, "] ", what, " ", n,
                  " is not divisible by tensor parallel size ", tp);
}

static bool is_bf16(const Tensor& x) {
  return x.dtype() == DType::bf16;
}

Tensor all_reduce_sum(Communicator& g, const Tensor& x) {
  Tensor t = is_bf16(x) ? x.to(DType::f32) : x.clone();
  g.all_reduce(t, ReduceOp::sum);
  return is_bf16(x) ? t.to(DType::bf16) : t;
}

Tensor reduce_scatter_sum(Communicator& g, const Tensor& x, int64_t dim, const char* op) {
  int64_t d = wrap_dim(dim, x.dim(), op);
  NXD_CHECK_SHAPE(x.size(d) % g.size() == 0, "[", op, "] dim ", d, " of ", x.desc(), " (",
                  x.size(d), ") is not divisible by tensor parallel size ", g.size());
  Tensor t = g.reduce_scatter(is_bf16(x) ? x.to(DType::f32) : x, d, ReduceOp::sum);
  return is_bf16(x) ? t.to(DType::bf16) : t;
}

Tensor all_gather(Communicator& g, const Tensor& x, int64_t dim) {
  return g.all_gather(x, dim);
}

Tensor split_own(Communicator& g, const Tensor& x, int64_t dim, const char* op) {
  int64_t d = wrap_dim(dim, x.dim(), op);
  NXD_CHECK_SHAPE(x.size(d) % g.size() == 0, "[", op, "] dim ", d, " of ", x.desc(), " (",
                  x.size(d), ") is not divisible by tensor parallel size ", g.size());
  int64_t n = x.size(d) / g.size();
  return x.narrow(d, g.rank() * n, n).clone();
}

}  // namespace tp_detail

using namespace tp_detail;

namespace {

Communicator& tp_group() {
  return parallel_state::get_tensor_model_parallel_group();
}

// A one-input, one-output custom function.
Tensor unary(const char* name, const Tensor& x, std::function<Tensor(const Tensor&)> fwd,
             std::function<Tensor(const Tensor&)> bwd) {
  NXD_CHECK(x.defined(), "[", name, "] undefined input");
  return autograd::custom(
      name, {x}, [fwd](const std::vector<Tensor>& in) { return std::vector<Tensor>{fwd(in[0])}; },
      [bwd](const Grads& g) -> Grads { return {bwd(g[0])}; })[0];
}

}  // namespace

Tensor copy_to_tensor_model_parallel_region(const Tensor& x, Communicator& group) {
  OpScope scope_("tp_copy");
  return scope_.out(
      [&]() -> Tensor {
        if (group.size() == 1) return x;
        Communicator* g = &group;
        return unary(
            "copy_to_tensor_model_parallel_region", x, [](const Tensor& t) { return t; },
            [g](const Tensor& dy) { return all_reduce_sum(*g, dy); });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs()};
      });
}

Tensor reduce_from_tensor_model_parallel_region(const Tensor& x, Communicator& group) {
  OpScope scope_("tp_all_reduce");
  return scope_.out(
      [&]() -> Tensor {
        if (group.size() == 1) return x;
        Communicator* g = &group;
        return unary(
            "reduce_from_tensor_model_parallel_region", x,
            [g](const Tensor& t) { return all_reduce_sum(*g, t); },
            [](const Tensor& dy) { return dy; });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs()};
      });
}

Tensor scatter_to_tensor_model_parallel_region(const Tensor& x, Communicator& group) {
  OpScope scope_("tp_scatter");
  return scope_.out(
      [&]() -> Tensor {
        if (group.size() == 1) return x;
        Communicator* g = &group;
        static const char* op = "scatter_to_tensor_model_parallel_region";
        NXD_CHECK(x.defined() && x.dim() >= 1, "[", op, "] needs a tensor with a last dim");
        check_divisible(op, "last dim", x.size(-1), group.size());
        return unary(
            op, x, [g](const Tensor& t) { return split_own(*g, t, -1, op); },
            [g](const Tensor& dy) { return all_gather(*g, dy, -1); });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs()};
      });
}

Tensor gather_from_tensor_model_parallel_region(const Tensor& x, Communicator& group) {
  OpScope scope_("tp_all_gather");
  return scope_.out(
      [&]() -> Tensor {
        if (group.size() == 1) return x;
        Communicator* g = &group;
        static const char* op = "gather_from_tensor_model_parallel_region";
        NXD_CHECK(x.defined() && x.dim() >= 1, "[", op, "] needs a tensor with a last dim");
        return unary(
            op, x, [g](const Tensor& t) { return all_gather(*g, t, -1); },
            [g](const Tensor& dy) { return split_own(*g, dy, -1, op); });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs()};
      });
}

Tensor scatter_to_sequence_parallel_region(const Tensor& x, int64_t seq_dim, Communicator& group) {
  OpScope scope_("sp_scatter");
  return scope_.out(
      [&]() -> Tensor {
        if (group.size() == 1) return x;
        Communicator* g = &group;
        static const char* op = "scatter_to_sequence_parallel_region";
        NXD_CHECK(x.defined(), "[", op, "] undefined input");
        int64_t d = wrap_dim(seq_dim, x.dim(), op);
        check_divisible(op, "sequence length", x.size(d), group.size());
        return unary(
            op, x, [g, d](const Tensor& t) { return split_own(*g, t, d, op); },
            [g, d](const Tensor& dy) { return all_gather(*g, dy, d); });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("dim", seq_dim)};
      });
}

Tensor gather_from_sequence_parallel_region(const Tensor& x, int64_t seq_dim,
                                            bool to_model_parallel, Communicator& group) {
  OpScope scope_("sp_all_gather");
  return scope_.out(
      [&]() -> Tensor {
        if (group.size() == 1) return x;
        Communicator* g = &group;
        static const char* op = "gather_from_sequence_parallel_region";
        NXD_CHECK(x.defined(), "[", op, "] undefined input");
        int64_t d = wrap_dim(seq_dim, x.dim(), op);
        return unary(
            op, x, [g, d](const Tensor& t) { return all_gather(*g, t, d); },
            [g, d, to_model_parallel](const Tensor& dy) {
              return to_model_parallel ? reduce_scatter_sum(*g, dy, d, op)
                                       : split_own(*g, dy, d, op);
            });
      }(),
      [&] {
        return OpCall{
            {x},
            OpAttrs().set("dim", seq_dim).set("to_model_parallel", int64_t(to_model_parallel))};
      });
}

Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, int64_t seq_dim,
                                                  Communicator& group) {
  OpScope scope_("sp_reduce_scatter");
  return scope_.out(
      [&]() -> Tensor {
        if (group.size() == 1) return x;
        Communicator* g = &group;
        static const char* op = "reduce_scatter_to_sequence_parallel_region";
        NXD_CHECK(x.defined(), "[", op, "] undefined input");
        int64_t d = wrap_dim(seq_dim, x.dim(), op);
        check_divisible(op, "sequence length", x.size(d), group.size());
        return unary(
            op, x, [g, d](const Tensor& t) { return reduce_scatter_sum(*g, t, d, op); },
            [g, d](const Tensor& dy) { return all_gather(*g, dy, d); });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("dim", seq_dim)};
      });
}

// ---- default group ----
Tensor copy_to_tensor_model_parallel_region(const Tensor& x) {
  return copy_to_tensor_model_parallel_region(x, tp_group());
}
Tensor reduce_from_tensor_model_parallel_region(const Tensor& x) {
  return reduce_from_tensor_model_parallel_region(x, tp_group());
}
Tensor scatter_to_tensor_model_parallel_region(const Tensor& x) {
  return scatter_to_tensor_model_parallel_region(x, tp_group());
}
Tensor gather_from_tensor_model_parallel_region(const Tensor& x) {
  return gather_from_tensor_model_parallel_region(x, tp_group());
}
Tensor scatter_to_sequence_parallel_region(const Tensor& x, int64_t seq_dim) {
  return scatter_to_sequence_parallel_region(x, seq_dim, tp_group());
}
Tensor gather_from_sequence_parallel_region(const Tensor& x, int64_t seq_dim,
                                            bool to_model_parallel) {
  return gather_from_sequence_parallel_region(x, seq_dim, to_model_parallel, tp_group());
}
Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, int64_t seq_dim) {
  return reduce_scatter_to_sequence_parallel_region(x, seq_dim, tp_group());
}

}  // namespace nxd
