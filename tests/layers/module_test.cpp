#include <gtest/gtest.h>
#include <cmath>

#include "nxd/layers/basic.h"
#include "nxd/layers/module.h"
#include "support/compare.h"

using namespace nxd;

namespace {

// A small tree: "proj" (Linear with bias), "blocks" (ModuleList of two Blocks), a buffer "scale".
struct Block : Module {
  std::shared_ptr<Linear> fc;
  std::shared_ptr<LayerNorm> norm;
  explicit Block(int64_t d) : Module("Block") {
    fc = register_module("fc", std::make_shared<Linear>(d, 2 * d));
    norm = register_module("norm", std::make_shared<LayerNorm>(2 * d));
  }
};
struct Toy : Module {
  std::shared_ptr<Linear> proj;
  std::shared_ptr<ModuleList> blocks;
  Tensor scale, scratch;
  explicit Toy(int64_t d = 3, DType dt = DType::f32) : Module("Toy") {
    LinearOptions lo;
    lo.param.dtype = dt;
    proj = register_module("proj", std::make_shared<Linear>(d, d, lo));
    blocks = register_module("blocks", std::make_shared<ModuleList>());
    for (int i = 0; i < 2; ++i) blocks->push_back(std::make_shared<Block>(d));
    scale = register_buffer("scale", full({d}, 2.0));
    scratch = register_buffer("scratch", zeros({1}), /*persistent=*/false);
  }
};

std::vector<std::string> names(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> n;
  for (auto& [k, t] : v) n.push_back(k);
  return n;
}

}  // namespace

TEST(Module, HierarchicalNamesInRegistrationOrder) {
  Toy m;
  std::vector<std::string> expect = {
      "proj.weight",          "proj.bias",          "blocks.0.fc.weight", "blocks.0.fc.bias",
      "blocks.0.norm.weight", "blocks.0.norm.bias", "blocks.1.fc.weight", "blocks.1.fc.bias",
      "blocks.1.norm.weight", "blocks.1.norm.bias"};
  EXPECT_EQ(names(m.named_parameters()), expect);
  EXPECT_EQ(m.parameters().size(), expect.size());
  for (auto& t : m.parameters()) EXPECT_TRUE(t.requires_grad());
  EXPECT_EQ(names(m.named_parameters(/*recurse=*/false)), std::vector<std::string>{});
  EXPECT_EQ(names(m.named_buffers()), (std::vector<std::string>{"scale", "scratch"}));
  EXPECT_EQ(m.num_parameters(), 3 * 3 + 3 + 2 * (6 * 3 + 6 + 6 + 6));
  EXPECT_TRUE(m.get_parameter("blocks.1.fc.weight").is_same(m.blocks->at<Block>(1)->fc->weight()));
  EXPECT_THROW(m.get_parameter("blocks.2.fc.weight"), InvalidArgument);
  auto mods = m.named_modules();
  ASSERT_EQ(mods.size(), 1u + 1 + 1 + 2 * 3);
  EXPECT_EQ(mods[0].first, "");
  EXPECT_EQ(mods[3].first, "blocks.0");
  EXPECT_EQ(mods[4].first, "blocks.0.fc");
}

TEST(Module, RegistrationErrors) {
  Module m("M");
  m.register_parameter("w", zeros({2}));
  EXPECT_THROW(m.register_parameter("w", zeros({2})), InvalidArgument);
  EXPECT_THROW(m.register_buffer("w", zeros({2})), InvalidArgument);
  EXPECT_THROW(m.register_module("w", std::make_shared<Module>()), InvalidArgument);
  EXPECT_THROW(m.register_parameter("a.b", zeros({2})), InvalidArgument);
  EXPECT_THROW(m.register_parameter("", zeros({2})), InvalidArgument);
  EXPECT_THROW(m.register_parameter("ids", zeros({2}, DType::i64)), InvalidArgument);
  try {
    m.register_parameter("w", zeros({2}));
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
}

TEST(Module, SharedTensorListedOnce) {
  Module m("M");
  Tensor w = zeros({4});
  m.register_parameter("a", w);
  auto child = m.register_module("c", std::make_shared<Module>("C"));
  child->register_parameter("tied", w);
  EXPECT_EQ(names(m.named_parameters()), std::vector<std::string>{"a"});
  EXPECT_EQ(m.state_dict().keys(), (std::vector<std::string>{"a", "c.tied"}));
  EXPECT_EQ(m.num_parameters(), 4);
}

TEST(Module, StateDictKeysAndRoundTripIsBitwise) {
  Toy a, b;
  a.init_parameters(1);
  b.init_parameters(2);
  StateDict sa = a.state_dict();
  // PyTorch order: a module's params, its buffers, then its children (the root has no params).
  std::vector<std::string> keys = names(a.named_parameters());
  keys.insert(keys.begin(), "scale");
  EXPECT_EQ(sa.keys(), keys);
  EXPECT_FALSE(sa.contains("scratch"));
  EXPECT_FALSE(nxd::testing::bitwise_equal(a.proj->weight(), b.proj->weight()));
  LoadResult r = b.load_state_dict(sa);
  EXPECT_TRUE(r.ok());
  for (auto& [k, t] : sa) EXPECT_BITWISE_EQ(b.state_dict().at(k), t) << k;
  // b's tensors are still its own (copied into, not replaced)
  EXPECT_FALSE(b.proj->weight().shares_storage(a.proj->weight()));
  EXPECT_TRUE(b.get_parameter("proj.weight").requires_grad());
}

TEST(Module, LoadStateDictShapeMismatchNamesKeyAndShapes) {
  Toy a(3), b(4);
  b.init_parameters(5);
  Tensor before = b.proj->weight().detach().clone();
  StateDict sa = a.state_dict();
  sa.erase("scale");  // so that proj.weight is the first mismatch
  try {
    b.load_state_dict(sa);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'proj.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3,3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4,4]"), std::string::npos) << msg;
  }
  // nothing was copied
  EXPECT_BITWISE_EQ(b.proj->weight().detach(), before);
  // non-strict still refuses a shape mismatch
  EXPECT_THROW(b.load_state_dict(sa, false), ShapeError);
}

TEST(Module, LoadStateDictDtypeMismatch) {
  Toy a(3, DType::f64), b(3, DType::f32);
  try {
    b.load_state_dict(a.state_dict());
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'proj.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f64[3,3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[3,3]"), std::string::npos) << msg;
  }
}

TEST(Module, MissingAndUnexpectedKeys) {
  Toy a, b;
  a.init_parameters(1);
  b.init_parameters(2);
  StateDict d = a.state_dict();
  ASSERT_TRUE(d.erase("blocks.1.fc.bias"));
  d.insert("blocks.7.fc.weight", zeros({2}));
  try {
    b.load_state_dict(d);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("missing keys 'blocks.1.fc.bias'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected keys 'blocks.7.fc.weight'"), std::string::npos) << msg;
  }
  // strict threw before copying anything
  EXPECT_FALSE(nxd::testing::bitwise_equal(b.proj->weight(), a.proj->weight()));
  Tensor kept = b.blocks->at<Block>(1)->fc->bias().detach().clone();
  LoadResult r = b.load_state_dict(d, /*strict=*/false);
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"blocks.1.fc.bias"});
  EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"blocks.7.fc.weight"});
  EXPECT_BITWISE_EQ(b.proj->weight().detach(), a.proj->weight().detach());
  EXPECT_BITWISE_EQ(b.blocks->at<Block>(1)->fc->bias().detach(), kept);
}

TEST(Module, TrainEvalIsRecursive) {
  Toy m;
  EXPECT_TRUE(m.is_training());
  m.eval();
  EXPECT_FALSE(m.is_training());
  EXPECT_FALSE(m.blocks->at<Block>(1)->norm->is_training());
  m.train();
  EXPECT_TRUE(m.blocks->at<Block>(0)->fc->is_training());
}

TEST(Module, ZeroGrad) {
  Toy m;
  for (auto& t : m.parameters()) t.set_grad(full(t.shape(), 3.0));
  m.zero_grad(/*set_to_none=*/false);
  for (auto& t : m.parameters()) {
    ASSERT_TRUE(t.grad().defined());
    EXPECT_EQ(t.grad().to_vector(), std::vector<double>(t.numel(), 0.0));
  }
  m.zero_grad();
  for (auto& t : m.parameters()) EXPECT_FALSE(t.grad().defined());
}

TEST(Module, InitDependsOnlyOnSeedAndName) {
  // Same full name in two differently built trees -> same values; values are torch.nn.Linear's
  // default, uniform(+-1/sqrt(in)) for weight and bias, from the stream named by the full name;
  // norm weights one.
  Toy a;
  a.init_parameters(42);
  Module other("Other");
  auto blocks = other.register_module("blocks", std::make_shared<ModuleList>());
  blocks->push_back(std::make_shared<Module>("Empty"));
  blocks->push_back(std::make_shared<Block>(3));
  other.init_parameters(42);
  EXPECT_BITWISE_EQ(other.get_parameter("blocks.1.fc.weight").detach(),
                    a.get_parameter("blocks.1.fc.weight").detach());
  Tensor ref = empty({6, 3});
  const double bound = 1.0 / std::sqrt(3.0);  // Block(3): fc is Linear(3, 6)
  init::uniform(ref, RngStream{42, stream_id("blocks.1.fc.weight")}, -bound, bound);
  EXPECT_BITWISE_EQ(a.get_parameter("blocks.1.fc.weight").detach(), ref);
  EXPECT_FALSE(nxd::testing::bitwise_equal(a.get_parameter("blocks.0.fc.weight").detach(), ref));
  Tensor bias_ref = empty({6});
  init::uniform(bias_ref, RngStream{42, stream_id("blocks.0.fc.bias")}, -bound, bound);
  EXPECT_BITWISE_EQ(a.get_parameter("blocks.0.fc.bias").detach(), bias_ref);
  EXPECT_EQ(a.get_parameter("blocks.0.norm.weight").to_vector(), std::vector<double>(6, 1.0));
  // another seed differs; the same seed again is identical
  Toy c, d;
  c.init_parameters(43);
  d.init_parameters(42);
  EXPECT_FALSE(nxd::testing::bitwise_equal(c.proj->weight(), a.proj->weight()));
  for (auto& [k, t] : a.state_dict()) EXPECT_BITWISE_EQ(d.state_dict().at(k), t) << k;
}

TEST(Module, ShardInitIsSliceOfFullInit) {
  // A layer holding rows [2,4) of a [6,3] weight, initialized through ParamInit::region, equals
  // that slice of the full weight (what tensor-parallel layers rely on).
  Module full_m("Full"), shard_m("Shard");
  full_m.register_parameter("w", zeros({6, 3}), ParamInit::normal(0.5));
  ParamInit pi = ParamInit::normal(0.5);
  pi.region = init::Region{{6, 3}, {2, 0}};
  shard_m.register_parameter("w", zeros({2, 3}), pi);
  full_m.init_parameters(9);
  shard_m.init_parameters(9);
  EXPECT_BITWISE_EQ(shard_m.get_parameter("w").detach(),
                    full_m.get_parameter("w").detach().narrow(0, 2, 2).contiguous());
}

TEST(Module, LayerSizesAndOptions) {
  Linear l(5, 7, LinearOptions{.bias = false});
  EXPECT_EQ(l.weight().shape(), (Shape{7, 5}));
  EXPECT_FALSE(l.bias().defined());
  EXPECT_EQ(names(l.named_parameters()), std::vector<std::string>{"weight"});
  Embedding e(11, 4);
  EXPECT_EQ(e.weight().shape(), (Shape{11, 4}));
  RMSNorm n(4);
  EXPECT_EQ(names(n.named_parameters()), std::vector<std::string>{"weight"});
  LayerNorm ln(4, LayerNormOptions{.bias = false});
  EXPECT_FALSE(ln.bias().defined());
  EXPECT_THROW(Linear(0, 3), InvalidArgument);
  EXPECT_THROW(Dropout(1.0), InvalidArgument);
  Linear meta(3, 4, LinearOptions{.param = {DType::f32, Device::meta}});
  meta.init_parameters(1);  // shapes only, nothing to fill
  EXPECT_TRUE(meta.weight().is_meta());
}
