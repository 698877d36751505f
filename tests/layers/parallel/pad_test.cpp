// Head padding: the padded attention (heads a multiple of TP) computes the same function as the
// original, and the gradients of every original parameter are unchanged.
#include <gtest/gtest.h>

#include "nxd/layers/parallel/pad.h"
#include "tp_util.h"

using namespace nxd;
using namespace nxd::testing;

namespace {

TEST(HeadPadding, Plans) {
  EXPECT_EQ(get_number_of_extra_heads(3, 4), 1);
  EXPECT_EQ(get_number_of_extra_heads(8, 4), 0);
  EXPECT_EQ(get_number_of_extra_heads(25, 8), 7);
  HeadPadding mha = plan_head_padding(3, 3, 4);
  EXPECT_EQ(mha.padded_heads, 4);
  EXPECT_EQ(mha.padded_kv_heads, 4);
  EXPECT_EQ(mha.q_source, (std::vector<int64_t>{0, 1, 2, -1}));
  HeadPadding gqa = plan_head_padding(6, 2, 4);  // 2 groups of 3 query heads -> 2 groups of 4
  EXPECT_EQ(gqa.padded_heads, 8);
  EXPECT_EQ(gqa.padded_kv_heads, 2);
  EXPECT_EQ(gqa.q_source, (std::vector<int64_t>{0, 1, 2, -1, 3, 4, 5, -1}));
  HeadPadding odd_kv = plan_head_padding(6, 3, 4);  // 3 KV heads neither divide nor divide 4
  EXPECT_EQ(odd_kv.padded_kv_heads, 4);
  EXPECT_EQ(odd_kv.padded_heads, 8);
  EXPECT_EQ(odd_kv.kv_source, (std::vector<int64_t>{0, 1, 2, -1}));
  EXPECT_EQ(odd_kv.q_source, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, -1, -1}));
  EXPECT_FALSE(plan_head_padding(8, 2, 4).needed());
}

struct PadCase {
  int64_t heads, kv_heads, tp;
  QkvLayout layout;
  bool bias;
};

TEST(HeadPadding, PaddedAttentionComputesTheSameFunction) {
  const PadCase cases[] = {{3, 3, 4, QkvLayout::separate, true},
                           {6, 2, 4, QkvLayout::separate, false},
                           {6, 3, 4, QkvLayout::separate, true},
                           {3, 3, 2, QkvLayout::fused_neox, true}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "heads=" << c.heads << " kv=" << c.kv_heads << " tp="
                                      << c.tp << " fused=" << (c.layout != QkvLayout::separate));
    AttentionOptions o;
    o.hidden_size = 12;
    o.num_heads = c.heads;
    o.num_kv_heads = c.kv_heads;
    o.layout = c.layout;
    o.bias = c.bias;
    o.init = {InitMethod::normal, 0.3};
    CausalSelfAttention attn(o);
    attn.init_parameters(3);
    if (c.bias) {  // non-zero biases
      NoGradGuard ng;
      for (auto& [n, t] : attn.named_parameters())
        if (n.find("bias") != std::string::npos) t.copy_(randn(t.shape(), 9, 0.5));
    }
    HeadPadding plan;
    StateDict padded_state = pad_model(attn, c.tp, &plan);
    ASSERT_TRUE(plan.needed());
    EXPECT_EQ(plan.padded_heads % c.tp, 0);
    EXPECT_TRUE(plan.padded_kv_heads % c.tp == 0 || c.tp % plan.padded_kv_heads == 0);
    CausalSelfAttention padded(pad_attention_options(o, plan));
    padded.load_state_dict(padded_state);

    Tensor xf = randn({2, 5, 12}, 1), up = randn({2, 5, 12}, 2);
    Tensor x1 = leaf(xf), x2 = leaf(xf);
    Tensor y1 = attn.forward(x1), y2 = padded.forward(x2);
    check_close(y2, y1, 1e-5, "padded output");
    backward(sum(mul(y1, up)));
    backward(sum(mul(y2, up)));
    check_close(x2.grad(), x1.grad(), 1e-5, "padded dX");
    // The original gradients, padded the same way (zeros at padded heads).
    StateDict grads;
    for (auto& [n, t] : attn.named_parameters()) grads.insert(n, t.grad());
    const int64_t d = padded.head_dim();
    StateDict want = pad_attention_state_dict(grads, "", plan, d, c.layout);
    Tensor mask = head_padding_mask(plan, d);
    for (auto& [n, t] : padded.named_parameters()) {
      Tensor g = t.grad();
      // Padded output-projection columns may get a gradient (GQA); compare original columns.
      if (n == "o_proj.weight" || n == "dense.weight") g = mul(g, mask);
      check_close(g, want.at(n), 1e-5, "padded d" + n);
    }
  }
}

}  // namespace
