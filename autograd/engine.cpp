// The backward engine. backward() first walks the graph from the roots to count, for every node,
// how many edges lead into it, and for every leaf how many gradients will reach it. Nodes then run
// when all their gradients have arrived, the most recently created first (so a chain of
// microbatch graphs unwinds in reverse order of creation). A leaf's hooks fire once its last
// gradient has been accumulated: that is what lets data-parallel buckets start their all-reduce
// while the rest of backward still runs.
#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "nxd/autograd/graph.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd {
namespace autograd {

namespace {
std::atomic<uint64_t> g_sequence{0};

AutogradMeta& meta_of(const Tensor& t) {
  auto& m = t.impl()->autograd;
  if (!m) m = std::make_shared<AutogradMeta>();
  return *m;
}

// dst += src (dst contiguous, same shape; src any strides and float dtype).
void add_into(const Tensor& dst, const Tensor& src) {
  if (dst.is_meta()) return;
  Tensor s = src.dtype() == dst.dtype() ? src : src.to(dst.dtype());
  dispatch(dst.dtype(), [&]<class T>() {
    T* d = static_cast<T*>(dst.raw_data());
    const T* p = static_cast<const T*>(s.raw_data());
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (dst.is_contiguous() && s.is_contiguous()) {  // elementwise: any split gives the same sums
        kernels::for_blocks(dst.numel(), 4096, 1, [&](int64_t b, int64_t e) {
          T* __restrict dd = d + b;
          const T* __restrict pp = p + b;
          for (int64_t i = 0; i < e - b; ++i) dd[i] += pp[i];
        });
        return;
      }
    }
    for_each_run(dst.shape(), dst.strides(), s.strides(),
                 [&](int64_t a, int64_t b, int64_t n, int64_t as, int64_t bs) {
                   if constexpr (std::is_same_v<T, bf16>) {
                     for (int64_t i = 0; i < n; ++i)
                       d[a + i * as] = bf16(float(d[a + i * as]) + float(p[b + i * bs]));
                   } else if (as == 1 && bs == 1) {
                     T* __restrict dd = d + a;
                     const T* __restrict pp = p + b;
                     for (int64_t i = 0; i < n; ++i) dd[i] += pp[i];
                   } else {
                     for (int64_t i = 0; i < n; ++i) d[a + i * as] += p[b + i * bs];
                   }
                 });
  });
}

// True when `t` is the only handle on its storage, so it can be adopted or updated in place.
bool exclusively_owned(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 && t.is_contiguous() &&
         t.offset() == 0;
}

// Sums a new gradient into a buffer slot, in place when the slot owns its memory.
void accumulate(Tensor& slot, Tensor g) {
  if (!slot.defined()) {
    slot = std::move(g);
    return;
  }
  if (exclusively_owned(slot)) {
    add_into(slot, g);
  } else if (g.dtype() == slot.dtype() && exclusively_owned(g)) {
    add_into(g, slot);  // the new gradient owns its memory: sum there instead of copying the slot
    slot = std::move(g);
  } else {
    slot = slot.clone();
    add_into(slot, g);
  }
}

void check_grad_shape(const Tensor& g, const Shape& expect, const std::string& node, size_t i,
                      const char* what) {
  if (g.shape() != expect)
    throw ShapeError(str("[backward] ", node, " returned a gradient ", g.desc(), " for ", what, " ",
                         i, " of shape ", shape_str(expect)));
}
}  // namespace

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn fn) {
  if (!needs_grad(inputs)) return;
  auto node = std::make_shared<Node>();
  node->name = name;
  node->backward = std::move(fn);
  node->sequence_nr = g_sequence.fetch_add(1, std::memory_order_relaxed);
  node->inputs.resize(inputs.size());
  node->leaves.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    auto& m = x.impl()->autograd;
    if (m && m->grad_fn)
      node->inputs[i] = Edge{m->grad_fn, m->output_nr};
    else
      node->leaves[i] = x.impl_ptr();
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& y = outputs[k];
    node->output_shapes.push_back(y.shape());
    node->output_dtypes.push_back(y.dtype());
    node->output_devices.push_back(y.device());
    if (!is_floating(y.dtype())) continue;  // integer outputs (indices) carry no gradient
    y.impl()->requires_grad = true;
    auto m = std::make_shared<AutogradMeta>();
    m->grad_fn = node;
    m->output_nr = static_cast<int>(k);
    y.impl()->autograd = std::move(m);
  }
}

std::shared_ptr<Node> grad_fn(const Tensor& t) {
  auto& m = t.impl()->autograd;
  return m ? m->grad_fn : nullptr;
}

bool is_leaf(const Tensor& t) {
  return grad_fn(t) == nullptr;
}

void register_hook(const Tensor& leaf, GradHook hook) {
  NXD_CHECK(leaf.requires_grad() && is_leaf(leaf), "[register_hook] ", leaf.desc(),
            " is not a leaf that requires grad");
  meta_of(leaf).hooks.push_back(std::move(hook));
}

void set_grad_buffer(const Tensor& leaf, const Tensor& buffer) {
  NXD_CHECK(leaf.requires_grad() && is_leaf(leaf), "[set_grad_buffer] ", leaf.desc(),
            " is not a leaf that requires grad");
  if (buffer.defined()) {
    NXD_CHECK_SHAPE(buffer.shape() == leaf.shape(), "[set_grad_buffer] buffer ", buffer.desc(),
                    " for leaf ", leaf.desc());
    NXD_CHECK(is_floating(buffer.dtype()) && buffer.is_contiguous() &&
                  buffer.device() == leaf.device() && !buffer.requires_grad(),
              "[set_grad_buffer] buffer ", buffer.desc(), " for leaf ", leaf.desc(),
              " must be a contiguous floating tensor on the leaf's device without a graph");
  }
  meta_of(leaf).grad_buffer = buffer.defined() ? buffer.impl_ptr() : nullptr;
}

void set_grad_dtype(const Tensor& leaf, DType dtype) {
  NXD_CHECK(leaf.requires_grad() && is_leaf(leaf) && is_floating(dtype), "[set_grad_dtype] ",
            leaf.desc(), " is not a leaf that requires grad, or ", dtype_name(dtype),
            " is not floating point");
  meta_of(leaf).has_grad_dtype = true;
  meta_of(leaf).grad_dtype = dtype;
}

void reset_grad_dtype(const Tensor& leaf) {
  if (leaf.impl()->autograd) leaf.impl()->autograd->has_grad_dtype = false;
}

Tensor grad_buffer(const Tensor& leaf) {
  const auto& m = leaf.impl()->autograd;
  return Tensor(m ? m->grad_buffer : nullptr);
}

namespace {

struct Run {
  // Where gradients for non-leaf tensors are captured instead of propagated (grad()).
  std::unordered_map<const Node*, std::vector<std::pair<int, size_t>>> capture_nodes;
  std::unordered_map<const TensorImpl*, size_t> capture_leaves;
  std::vector<Tensor>* captured = nullptr;
  bool accumulate_leaves = true;
};

// The gradient each output starts from: the given one, or ones for a scalar output.
std::vector<Tensor> seed_gradients(const std::vector<Tensor>& outputs,
                                   const std::vector<Tensor>& grads_in) {
  std::vector<Tensor> seeds(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& y = outputs[i];
    NXD_CHECK(y.requires_grad(), "[backward] output ", i, " (", y.desc(),
              ") does not require grad: nothing to differentiate");
    Tensor g = grads_in.empty() ? Tensor() : grads_in[i];
    if (!g.defined()) {
      NXD_CHECK(y.numel() == 1, "[backward] output ", i, " is ", y.desc(),
                ": a gradient is needed for a non-scalar output");
      g = ones(y.shape(), y.dtype(), y.device());
    }
    NXD_CHECK_SHAPE(g.shape() == y.shape(), "[backward] gradient ", g.desc(), " for output ", i,
                    " of shape ", shape_str(y.shape()));
    seeds[i] = g;
  }
  return seeds;
}

// One backward pass over the graph reachable from the outputs: the counts of the first walk,
// the gradient buffers of nodes not yet run, and the queue of nodes whose gradients are complete.
class Pass {
 public:
  Pass(const BackwardOptions& opts, Run& run) : opts_(opts), run_(run) {}

  // Counts edges into nodes and gradients into leaves over the reachable graph.
  void count_dependencies(const std::vector<Tensor>& outputs) {
    std::unordered_set<Node*> seen;
    std::vector<Node*> stack;
    for (const auto& y : outputs) {
      auto f = grad_fn(y);
      if (f) {
        if (seen.insert(f.get()).second) stack.push_back(f.get());
      } else {
        ++leaf_uses_[y.impl()];
      }
    }
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (size_t i = 0; i < n->inputs.size(); ++i) {
        if (Node* c = n->inputs[i].node.get()) {
          ++deps_[c];
          if (seen.insert(c).second) stack.push_back(c);
        } else if (auto leaf = n->leaves[i].lock()) {
          ++leaf_uses_[leaf.get()];
        }
      }
    }
  }

  // Hands each output's seed to its node (or to the output itself if it is a leaf) and queues
  // the nodes nothing else feeds.
  void seed(const std::vector<Tensor>& outputs, const std::vector<Tensor>& seeds) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      auto f = grad_fn(outputs[i]);
      if (f) {
        auto& buf = buffers_[f.get()];
        buf.resize(f->output_shapes.size());
        accumulate(buf[outputs[i].impl()->autograd->output_nr], seeds[i]);
        keep_.push_back(f);
      } else {
        deliver_leaf(outputs[i].impl_ptr(), seeds[i]);
      }
    }
    for (auto& f : keep_)
      if (deps_[f.get()] == 0) {
        deps_[f.get()] = -1;  // queued
        ready_.push(f.get());
      }
  }

  // Runs the queued nodes, latest created first, until none is left.
  void run_ready() {
    while (!ready_.empty()) {
      Node* n = ready_.top();
      ready_.pop();
      run_node(n);
    }
  }

 private:
  void run_node(Node* n) {
    std::vector<Tensor> gout = std::move(buffers_[n]);
    buffers_.erase(n);
    gout.resize(n->output_shapes.size());
    for (size_t k = 0; k < gout.size(); ++k)
      if (!gout[k].defined())
        gout[k] = zeros(n->output_shapes[k], n->output_dtypes[k], n->output_devices[k]);
    if (auto it = run_.capture_nodes.find(n); it != run_.capture_nodes.end())
      for (auto [k, slot] : it->second) accumulate((*run_.captured)[slot], gout[k]);
    if (!n->backward)
      throw InvalidArgument(str("[backward] the graph of ", n->name,
                                " was already freed by an earlier backward; pass "
                                "retain_graph = true to run backward twice"));
    Grads gin = n->backward(gout);
    gout.clear();
    if (!opts_.retain_graph) n->backward = nullptr;
    if (gin.size() != n->inputs.size())
      throw InternalError(str("[backward] ", n->name, " returned ", gin.size(), " gradients for ",
                              n->inputs.size(), " inputs"));
    for (size_t i = 0; i < gin.size(); ++i) pass_to_input(n, i, std::move(gin[i]));
  }

  // Gradient g of node n's input i: into the producing node's buffer (queued once complete) or
  // to the leaf.
  void pass_to_input(Node* n, size_t i, Tensor g) {
    Edge& e = n->inputs[i];
    if (e.node) {
      if (g.defined()) {
        check_grad_shape(g, e.node->output_shapes[e.output_nr], n->name, i, "input");
        auto& buf = buffers_[e.node.get()];
        buf.resize(e.node->output_shapes.size());
        accumulate(buf[e.output_nr], std::move(g));
      }
      if (--deps_[e.node.get()] == 0) {
        deps_[e.node.get()] = -1;
        ready_.push(e.node.get());
      }
    } else if (auto leaf = n->leaves[i].lock()) {
      if (g.defined())
        deliver_leaf(leaf, std::move(g));
      else if (--leaf_uses_[leaf.get()] == 0 && leaf->autograd)
        for (auto& h : leaf->autograd->hooks) h(Tensor(leaf));
    }
  }

  void deliver_leaf(const std::shared_ptr<TensorImpl>& leaf, Tensor g) {
    Tensor lt(leaf);
    if (auto it = run_.capture_leaves.find(leaf.get()); it != run_.capture_leaves.end())
      accumulate((*run_.captured)[it->second], g);
    if (run_.accumulate_leaves && leaf->requires_grad) {
      NXD_CHECK_SHAPE(g.shape() == leaf->shape, "[backward] gradient ", g.desc(), " for leaf ",
                      lt.desc());
      if (!leaf->grad && leaf->autograd && leaf->autograd->grad_buffer) {
        Tensor b(leaf->autograd->grad_buffer);
        b.copy_(g);  // the first gradient of a pass overwrites whatever the buffer held
        leaf->grad = b.impl_ptr();
      } else if (!leaf->grad) {
        const DType gd = leaf->autograd && leaf->autograd->has_grad_dtype
                             ? leaf->autograd->grad_dtype
                             : leaf->dtype;
        bool adopt = g.dtype() == gd && exclusively_owned(g);
        leaf->grad = adopt ? g.impl_ptr() : g.to(gd).clone().impl_ptr();
        if (adopt) g = Tensor();
      } else {
        add_into(Tensor(leaf->grad), g);
      }
    }
    if (--leaf_uses_[leaf.get()] == 0 && leaf->autograd)
      for (auto& h : leaf->autograd->hooks) h(lt);
  }

  // The queue's order: the most recently created node on top.
  struct CreatedEarlier {
    bool operator()(Node* a, Node* b) const { return a->sequence_nr < b->sequence_nr; }
  };

  const BackwardOptions& opts_;
  Run& run_;
  std::unordered_map<Node*, int> deps_;
  std::unordered_map<TensorImpl*, int> leaf_uses_;
  std::unordered_map<Node*, std::vector<Tensor>> buffers_;
  std::priority_queue<Node*, std::vector<Node*>, CreatedEarlier> ready_;
  std::vector<std::shared_ptr<Node>> keep_;  // nodes stay alive while the run needs them
};

void execute(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads_in,
             const BackwardOptions& opts, Run& run) {
  NXD_CHECK(grads_in.empty() || grads_in.size() == outputs.size(), "[backward] ", outputs.size(),
            " outputs but ", grads_in.size(), " gradients");
  NoGradGuard no_grad;
  std::vector<Tensor> seeds = seed_gradients(outputs, grads_in);
  Pass pass(opts, run);
  pass.count_dependencies(outputs);
  pass.seed(outputs, seeds);
  pass.run_ready();
}

}  // namespace
}  // namespace autograd

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads,
              autograd::BackwardOptions opts) {
  autograd::Run run;
  autograd::execute(outputs, grads, opts, run);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, autograd::BackwardOptions opts) {
  autograd::Run run;
  std::vector<Tensor> result(inputs.size());
  run.captured = &result;
  run.accumulate_leaves = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    NXD_CHECK(x.requires_grad(), "[grad] input ", i, " (", x.desc(), ") does not require grad");
    if (auto f = autograd::grad_fn(x))
      run.capture_nodes[f.get()].push_back({x.impl()->autograd->output_nr, i});
    else
      run.capture_leaves[x.impl()] = i;
  }
  autograd::execute(outputs, grad_outputs, opts, run);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!result[i].defined()) result[i] = zeros_like(inputs[i].detach());
  return result;
}

}  // namespace nxd
