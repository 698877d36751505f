#include <gtest/gtest.h>

#include "nxd/runtime/tensor.h"
#include "support/compare.h"

using namespace nxd;

TEST(Tensor, CreationAndAccess) {
  Tensor t = arange(0, 6, 1, DType::f32).view({2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.at({1, 2}), 5.0);
  t.set({0, 1}, 42);
  EXPECT_EQ(t.at({0, 1}), 42.0);
  EXPECT_EQ(zeros({3}).to_vector(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(full({2}, 2.5, DType::f64).to_vector(), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(arange(4).dtype(), DType::i64);
  EXPECT_EQ(scalar(3).item(), 3.0);
  EXPECT_THROW(t.at({2, 0}), ShapeError);
  EXPECT_THROW(t.at({0}), ShapeError);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = arange(0, 24, 1).view({2, 3, 4});
  Tensor tr = t.transpose(0, 2);
  EXPECT_TRUE(tr.shares_storage(t));
  EXPECT_EQ(tr.shape(), (Shape{4, 3, 2}));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.at({3, 2, 1}), t.at({1, 2, 3}));
  Tensor n = t.narrow(1, 1, 2);
  EXPECT_EQ(n.at({1, 0, 0}), t.at({1, 1, 0}));
  n.set({0, 0, 0}, -1);
  EXPECT_EQ(t.at({0, 1, 0}), -1.0);
  Tensor p = t.permute({1, 2, 0});
  EXPECT_EQ(p.at({2, 3, 1}), t.at({1, 2, 3}));
  Tensor s = t.select(2, 1);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.at({1, 2}), t.at({1, 2, 1}));
  Tensor sl = t.slice(2, 0, 4, 2);
  EXPECT_EQ(sl.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(sl.at({0, 0, 1}), t.at({0, 0, 2}));
  Tensor e = arange(0, 3, 1).view({3, 1}).expand({2, 3, 4});
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_EQ(e.at({1, 2, 3}), 2.0);
  EXPECT_EQ(t.unsqueeze(1).shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(t.unsqueeze(1).squeeze(1).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.flatten(1).shape(), (Shape{2, 12}));
}

TEST(Tensor, ReshapeViewsWhenPossibleCopiesOtherwise) {
  Tensor t = arange(0, 24, 1).view({2, 3, 4});
  EXPECT_TRUE(t.view({6, -1}).shares_storage(t));
  Tensor tr = t.transpose(1, 2);  // [2,4,3]
  EXPECT_THROW(tr.view({2, 12}), ShapeError);
  Tensor r = tr.reshape({2, 12});
  EXPECT_FALSE(r.shares_storage(t));
  EXPECT_EQ(r.at({0, 1}), t.at({0, 1, 0}));
  // merging dims that are contiguous among themselves works on a non-contiguous tensor
  Tensor nar = arange(0, 24, 1).view({4, 6}).narrow(1, 0, 4);  // [4,4] stride [6,1]
  EXPECT_TRUE(nar.view({4, 2, 2}).shares_storage(nar));
  EXPECT_THROW(t.view({5, -1}), ShapeError);
}

TEST(Tensor, ChunkSplitCatStack) {
  Tensor t = arange(0, 10, 1);
  auto c = t.chunk(3, 0);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].numel(), 4);
  EXPECT_EQ(c[2].numel(), 2);
  auto s = t.split(std::vector<int64_t>{2, 8}, 0);
  EXPECT_EQ(s[1].at({0}), 2.0);
  EXPECT_THROW(t.split(std::vector<int64_t>{2, 7}, 0), ShapeError);
  Tensor back = cat_raw(c, 0);
  EXPECT_BITWISE_EQ(back, t);
  Tensor st = stack_raw({t, t}, 0);
  EXPECT_EQ(st.shape(), (Shape{2, 10}));
  EXPECT_THROW(cat_raw({t, zeros({2, 2})}, 0), ShapeError);
  EXPECT_THROW(cat_raw({t, zeros({2}, DType::f64)}, 0), InvalidArgument);
}

TEST(Tensor, CopyBroadcastAndConvert) {
  Tensor dst = zeros({2, 3}, DType::f64);
  dst.copy_(from_vector<float>({1, 2, 3}, {3}));
  EXPECT_EQ(dst.to_vector(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  Tensor tt = arange(0, 6, 1).view({2, 3}).t().contiguous();
  EXPECT_TRUE(tt.is_contiguous());
  EXPECT_EQ(tt.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(dst.copy_(zeros({4})), ShapeError);
}

TEST(Tensor, MetaTensorsHaveShapesNoData) {
  int64_t before = device_memory(Device::host).live();
  Tensor m = empty({1024, 1024}, DType::f32, Device::meta);
  EXPECT_EQ(device_memory(Device::host).live(), before);
  EXPECT_EQ(m.transpose(0, 1).shape(), (Shape{1024, 1024}));
  EXPECT_TRUE(m.contiguous().is_meta());
  EXPECT_THROW(m.raw_data(), InvalidArgument);
  EXPECT_NE(m.to_string().find("meta"), std::string::npos);
}

TEST(Tensor, RawViewOfGradTensorThrows) {
  Tensor w = zeros({2, 2});
  w.set_requires_grad(true);
  try {
    w.transpose(0, 1);
    FAIL() << "expected a throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("nxd::transpose"), std::string::npos) << e.what();
  }
  NoGradGuard ng;
  EXPECT_EQ(w.transpose(0, 1).shape(), (Shape{2, 2}));
  EXPECT_FALSE(w.detach().requires_grad());
}

TEST(Tensor, ErrorsNameOpAndShapes) {
  Tensor t = zeros({2, 3});
  try {
    t.view({4, 2});
    FAIL();
  } catch (const ShapeError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[view]"), std::string::npos) << m;
    EXPECT_NE(m.find("[2,3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[4,2]"), std::string::npos) << m;
  }
  EXPECT_THROW(t.transpose(0, 2), ShapeError);
  EXPECT_THROW(t.narrow(1, 2, 2), ShapeError);
  EXPECT_THROW(t.expand({2, 4}), ShapeError);
  EXPECT_THROW(t.data<double>(), InvalidArgument);
  EXPECT_THROW(Tensor().shape(), InvalidArgument);
}

TEST(Tensor, Printing) {
  Tensor t = arange(0, 4, 1).view({2, 2});
  EXPECT_EQ(t.to_string(), "tensor(f32[2,2], [[0, 1], [2, 3]])");
  EXPECT_EQ(arange(3).to_string(), "tensor(i64[3], [0, 1, 2])");
}
