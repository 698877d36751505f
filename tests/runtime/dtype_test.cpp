#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nxd/runtime/tensor.h"

using namespace nxd;

static uint16_t bits_of(float f) {
  return bf16::from_f32(f);
}
static float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(BF16, KnownBitPatterns) {
  EXPECT_EQ(bits_of(1.0f), 0x3f80);
  EXPECT_EQ(bits_of(-2.0f), 0xc000);
  EXPECT_EQ(bits_of(0.0f), 0x0000);
  EXPECT_EQ(bits_of(-0.0f), 0x8000);
  EXPECT_EQ(bits_of(INFINITY), 0x7f80);
  EXPECT_EQ(bits_of(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(bf16::to_f32(bits_of(NAN))));
  // a signalling NaN whose payload is all in the low bits must stay NaN, not become Inf
  EXPECT_TRUE(std::isnan(bf16::to_f32(bits_of(from_bits(0x7f800001u)))));
  // ties round to even: 0x3f808000 is halfway between 0x3f80 and 0x3f81 -> 0x3f80 (even)
  EXPECT_EQ(bits_of(from_bits(0x3f808000u)), 0x3f80);
  // 0x3f818000 is halfway between 0x3f81 and 0x3f82 -> 0x3f82 (even)
  EXPECT_EQ(bits_of(from_bits(0x3f818000u)), 0x3f82);
  // above halfway rounds up, below rounds down
  EXPECT_EQ(bits_of(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bits_of(from_bits(0x3f807fffu)), 0x3f80);
  // the largest finite f32 rounds to Inf in bf16 (it is above bf16's max + half ulp)
  EXPECT_EQ(bits_of(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(bf16::to_f32(0x3f80), 1.0f);
}

TEST(BF16, TensorConversionRoundTrip) {
  Tensor f = from_vector<float>({1.0f, 3.14159f, -1e-3f, 65504.0f, INFINITY, NAN}, {6});
  Tensor b = f.to(DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.nbytes(), 12);
  Tensor back = b.to(DType::f32);
  auto v = back.to_vector();
  EXPECT_EQ(v[0], 1.0);
  EXPECT_EQ(v[1], 3.140625);  // 0x4049
  EXPECT_TRUE(std::isinf(v[4]));
  EXPECT_TRUE(std::isnan(v[5]));
  EXPECT_EQ(b.data<bf16>()[1].bits, 0x4049);
}

TEST(DType, NamesAndIntConversion) {
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::bf16);
  EXPECT_THROW(dtype_from_name("f16"), InvalidArgument);
  Tensor i = from_vector<float>({1.7f, -1.7f}, {2}).to(DType::i32);
  EXPECT_EQ(i.to_vector(), (std::vector<double>{1, -1}));
  EXPECT_EQ(dtype_size(DType::i64), 8);
}
