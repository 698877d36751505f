// run_param_unit (layers/param_unit.h): the order of a unit's gathers and releases around a
// module's forward and backward, that the graph's saved views of the parameters read the
// re-gathered values after their storage was released (the weights' memory is really gone in
// between), gradients bitwise those of the plain forward, and a finite-difference gradcheck (f64)
// through the two recorded identities.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nxd/autograd/function.h"
#include "nxd/autograd/ops.h"
#include "nxd/layers/basic.h"
#include "nxd/layers/param_unit.h"

using namespace nxd;

namespace {

// A unit over one module's parameters that really frees their storage: it keeps a copy of the
// values and writes it back into a fresh block at each gather (what ZeRO-3's all-gather does).
class CopyUnit : public ParamUnit {
 public:
  CopyUnit(const Module& m, bool reshard) : reshard_(reshard) {
    for (const Tensor& p : m.parameters()) {
      params_.push_back(p);
      saved_.push_back(p.detach().clone());
    }
  }
  void gather(UnitPass pass) override {
    log.push_back(std::string("gather ") + name(pass));
    NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].storage()->has_data()) continue;
      params_[i].storage()->reallocate();
      params_[i].detach().copy_(saved_[i]);
    }
  }
  void release(UnitPass pass) override {
    log.push_back(std::string("release ") + name(pass));
    for (const Tensor& p : params_) p.storage()->release_data();
  }
  bool reshard_after_forward() const override { return reshard_; }
  bool gathered() const override { return !released(); }
  bool held_whole() const override { return false; }
  bool released() const { return !params_[0].storage()->has_data(); }
  std::vector<std::string> log;

 private:
  static const char* name(UnitPass p) {
    return p == UnitPass::forward ? "forward" : p == UnitPass::backward ? "backward" : "outside";
  }
  bool reshard_;
  std::vector<Tensor> params_, saved_;
};

std::shared_ptr<Linear> make_linear(DType dt) {
  auto l = std::make_shared<Linear>(4, 3, LinearOptions{.param = {.dtype = dt}});
  l->init_parameters(7);
  return l;
}

}  // namespace

TEST(ParamUnit, GathersAroundForwardAndBackwardAndGradientsAreThePlainOnes) {
  for (const bool reshard : {true, false}) {
    auto plain = make_linear(DType::f32), unit = make_linear(DType::f32);
    auto u = std::make_shared<CopyUnit>(*unit, reshard);
    unit->set_param_unit(u);
    u->release(UnitPass::outside);  // sharded between uses
    u->log.clear();
    Tensor x = from_doubles({0.1, -0.2, 0.3, 0.4, 0.5, -0.6, 0.7, 0.8}, {2, 4});
    x.set_requires_grad(true);
    Tensor x2 = x.detach().clone().set_requires_grad(true);
    auto body = [](const Linear& l) {
      return [&l](const Tensor& in) { return tanh(l.forward(in)); };
    };
    Tensor y = run_param_unit(*unit, x, body(*unit));
    EXPECT_EQ(u->released(), reshard);  // the saved views of the weight keep no memory
    backward(sum(y));
    backward(sum(body(*plain)(x2)));
    EXPECT_TRUE(u->released());
    const std::vector<std::string> want =
        reshard ? std::vector<std::string>{"gather forward", "release forward", "gather backward",
                                           "release backward"}
                : std::vector<std::string>{"gather forward", "gather backward", "release backward"};
    EXPECT_EQ(u->log, want) << "reshard " << reshard;
    for (const char* n : {"weight", "bias"})
      EXPECT_EQ(unit->get_parameter(n).grad().to_vector(),
                plain->get_parameter(n).grad().to_vector())
          << n;
    EXPECT_EQ(x.grad().to_vector(), x2.grad().to_vector());
  }
}

TEST(ParamUnit, NoGradForwardReleasesAndAModuleWithoutUnitIsAPlainCall) {
  auto unit = make_linear(DType::f32);
  auto u = std::make_shared<CopyUnit>(*unit, false);
  unit->set_param_unit(u);
  Tensor x = ones({1, 4});
  {
    NoGradGuard ng;
    run_param_unit(*unit, x, [&](const Tensor& in) { return unit->forward(in); });
  }
  EXPECT_TRUE(u->released());  // no backward follows: released even without reshard
  auto plain = make_linear(DType::f32);
  const Tensor a = run_param_unit(*plain, x, [&](const Tensor& in) { return plain->forward(in); });
  EXPECT_EQ(a.to_vector(), plain->forward(x).to_vector());
}

TEST(ParamUnit, GradcheckThroughTheUnitsIdentities) {
  auto unit = make_linear(DType::f64);
  auto u = std::make_shared<CopyUnit>(*unit, true);
  unit->set_param_unit(u);
  Tensor x = from_doubles({0.1, -0.2, 0.3, 0.4, 0.5, -0.6, 0.7, 0.8}, {2, 4}, DType::f64);
  const auto r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            run_param_unit(*unit, in[0], [&](const Tensor& h) { return tanh(unit->forward(h)); })};
      },
      {x});
  EXPECT_TRUE(r.ok) << r.message;
}
