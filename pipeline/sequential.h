#pragma once
// PipelineSequential: any model as an ordered list of pieces, the form in which the generic
// pipeline (generic_pipeline.h) cuts it into stages. It is nxd's stand-in for the torch.fx trace
// NxD's NxDPPModel takes of a module: C++ has no tracer over arbitrary code, so the model says
// which top-level pieces it runs, in which order, and how each one runs.
//
//   auto net = std::make_shared<PipelineSequential>("Regressor");
//   net->add_piece("inp", std::make_shared<Linear>(8, 32),
//                  [](Linear& l, const Tensor&, const Batch& mb) { return l.forward(mb.at("x"));
//                  });
//   for (int i = 0; i < 4; ++i)
//     net->add_piece("block" + std::to_string(i), std::make_shared<Block>(32),
//                    [](Block& b, const Tensor& x, const Batch&) { return b.forward(x); });
//   net->add_piece("head", std::make_shared<Linear>(32, 1),
//                  [](Linear& l, const Tensor& x, const Batch&) { return l.forward(x); });
//
// Each piece is a registered child module (its parameters keep the whole model's names: the piece
// name, then its own) and a function of the previous piece's output and the microbatch. The first
// piece reads the microbatch (its `x` is undefined); every piece but the last returns one tensor
// (the activation a stage sends to the next one); the last piece returns the model's outputs, one
// tensor or several (std::vector<Tensor>), which the loss reads (generic_pipeline.h, LossSpec).
// A subclass builds its pieces in its constructor with add_piece.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "nxd/layers/module.h"

namespace nxd::pipeline {

// A batch by name (NxD's run_train(**batch)): every tensor's dim 0 is the batch's rows, which the
// pipeline splits into microbatches.
using Batch = std::map<std::string, Tensor>;

// Runs one piece: `x` is the previous piece's output (undefined for the first piece), `mb` the
// microbatch. Returns the piece's outputs.
using PieceFn = std::function<std::vector<Tensor>(Module& piece, const Tensor& x, const Batch& mb)>;

struct Piece {
  std::string name;                // its child name in the model (pipeline_cuts name it)
  std::shared_ptr<Module> module;  // null where the pipeline does not hold it (another stage's)
  PieceFn run;
  std::string type;  // module->type_name() (transformer_layer_cls names it)
};

class PipelineSequential : public Module {
 public:
  explicit PipelineSequential(std::string type_name = "PipelineSequential")
      : Module(std::move(type_name)) {}

  // Registers `m` as the child `name` and appends it as the next piece, run by fn(M&, x, mb),
  // which returns a Tensor or a std::vector<Tensor>.
  template <class M, class F>
  std::shared_ptr<M> add_piece(const std::string& name, std::shared_ptr<M> m, F fn) {
    register_module(name, m);
    PieceFn run = [fn = std::move(fn)](Module& p, const Tensor& x,
                                       const Batch& mb) -> std::vector<Tensor> {
      M& typed = static_cast<M&>(p);
      if constexpr (std::is_same_v<std::invoke_result_t<const F&, M&, const Tensor&, const Batch&>,
                                   Tensor>)
        return {fn(typed, x, mb)};
      else
        return fn(typed, x, mb);
    };
    pieces_.push_back({name, m, std::move(run), m->type_name()});
    return m;
  }
  const std::vector<Piece>& pieces() const { return pieces_; }

  // The whole model on one rank: every piece in order; the last piece's outputs.
  std::vector<Tensor> forward(const Batch& mb) const;

 private:
  std::vector<Piece> pieces_;
};

// Runs piece p (index i of n) on x; ShapeError naming the piece when a piece other than the last
// returns anything but one tensor.
std::vector<Tensor> run_piece(const Piece& p, int64_t i, int64_t n, const Tensor& x,
                              const Batch& mb);

}  // namespace nxd::pipeline
