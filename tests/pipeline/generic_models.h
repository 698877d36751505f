#pragma once
// The generic pipeline's test model: a residual MLP regressor as a PipelineSequential
//   embed (Linear D->H) -> block0..blockN (ResBlock: x + fc2(gelu(fc1(x))), TP column/row) -> head
// whose head is a Linear H->D, or (tied) the embedding's weight transposed (the same tensor,
// registered in both pieces). Initialized by name from one seed: equal at any TP degree.
#include <memory>
#include <string>

#include "nxd/autograd/ops.h"
#include "nxd/layers/basic.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/pipeline/sequential.h"

namespace nxd::testing {

struct ResBlock : Module {
  std::shared_ptr<ColumnParallelLinear> fc1;
  std::shared_ptr<RowParallelLinear> fc2;
  ResBlock(int64_t h, ParamOptions po) : Module("ResBlock") {
    ColumnParallelLinearOptions c;
    c.gather_output = false;
    c.param = po;
    RowParallelLinearOptions r;
    r.input_is_parallel = true;
    r.param = po;
    fc1 = register_module("fc1", std::make_shared<ColumnParallelLinear>(h, 2 * h, c));
    fc2 = register_module("fc2", std::make_shared<RowParallelLinear>(2 * h, h, r));
  }
  Tensor forward(const Tensor& x) const { return add(x, fc2->forward(gelu(fc1->forward(x)))); }
};

// x [B,H] -> x W with the embedding's W [H,D]: a weight tied to another piece's.
struct TiedHead : Module {
  Tensor w;
  explicit TiedHead(const Tensor& embed_weight) : Module("TiedHead") {
    w = register_parameter("weight", embed_weight);
  }
  Tensor forward(const Tensor& x) const { return matmul(x, w); }
};

enum class HeadKind { linear, tied };
// What the last piece returns: the prediction, or {prediction, its own MSE loss against "y"}.
enum class HeadOutputs { prediction, prediction_and_loss };

inline Tensor mse(const Tensor& pred, const Tensor& y) {
  return mean(square(sub(pred, y)));
}

inline std::shared_ptr<pipeline::PipelineSequential> regressor(int64_t D, int64_t H, int blocks,
                                                               HeadKind head, HeadOutputs outs,
                                                               uint64_t seed,
                                                               ParamOptions po = {}) {
  using pipeline::Batch;
  auto net = std::make_shared<pipeline::PipelineSequential>("Regressor");
  LinearOptions lo;
  lo.param = po;
  auto embed = net->add_piece(
      "embed", std::make_shared<Linear>(D, H, lo),
      [](Linear& l, const Tensor&, const Batch& mb) { return l.forward(mb.at("x")); });
  for (int i = 0; i < blocks; ++i)
    net->add_piece("block" + std::to_string(i), std::make_shared<ResBlock>(H, po),
                   [](ResBlock& b, const Tensor& x, const Batch&) { return b.forward(x); });
  auto finish = [outs](const Tensor& pred, const Batch& mb) -> std::vector<Tensor> {
    if (outs == HeadOutputs::prediction) return {pred};
    return {pred, mse(pred, mb.at("y"))};
  };
  if (head == HeadKind::tied)
    net->add_piece("head", std::make_shared<TiedHead>(embed->weight()),
                   [finish](TiedHead& h, const Tensor& x, const Batch& mb) {
                     return finish(h.forward(x), mb);
                   });
  else
    net->add_piece(
        "head", std::make_shared<Linear>(H, D, lo),
        [finish](Linear& l, const Tensor& x, const Batch& mb) { return finish(l.forward(x), mb); });
  if (po.device != Device::meta) net->init_parameters(seed);
  return net;
}

}  // namespace nxd::testing
