// Every parallel layer runs on meta tensors (shapes only, as the memory planner uses them):
// forward and backward give the right shapes at TP 2 and 4 with SP and KV replication.
#include <gtest/gtest.h>

#include "nxd/layers/parallel/cross_entropy.h"
#include "nxd/layers/parallel/qkv.h"
#include "tp_util.h"

using namespace nxd;
using namespace nxd::testing;

namespace {

TEST(ParallelLayersMeta, ShapesOnlyForwardAndBackward) {
  for (int tp : {2, 4}) {
    run_tp(tp, [&](Communicator&) {
      const int64_t B = 2, S = 8, HID = 16, V = 32, H = 8, HKV = 2, D = 2;
      ParamOptions meta{DType::f32, Device::meta};
      ParallelEmbeddingOptions eo;
      eo.sequence_parallel_enabled = true;
      eo.param = meta;
      ParallelEmbedding emb(V, HID, eo);
      RMSNorm norm(HID, RMSNormOptions{.sequence_parallel_enabled = true, .param = meta});
      GQAQKVColumnParallelLinearOptions qo;
      qo.sequence_parallel_enabled = true;
      qo.kv_size_multiplier = std::max(1, tp / int(HKV));
      qo.head_dim = D;
      qo.param = meta;
      GQAQKVColumnParallelLinear qkv(HID, H * D, HKV * D, qo);
      RowParallelLinearOptions ro;
      ro.input_is_parallel = true;
      ro.sequence_parallel_enabled = true;
      ro.param = meta;
      RowParallelLinear o_proj(H * D, HID, ro);
      ColumnParallelLinearOptions co;
      co.gather_output = false;
      co.sequence_parallel_enabled = true;
      co.param = meta;
      ColumnParallelLinear head(HID, V, co);

      Tensor ids = empty({B, S}, DType::i64, Device::meta);
      Tensor h = norm.forward(emb.forward(ids));
      EXPECT_EQ(h.shape(), (Shape{B, S / tp, HID}));
      auto [q, k, v] = qkv.forward(h);
      EXPECT_EQ(q.shape(), (Shape{B, S, H * D / tp}));
      EXPECT_EQ(k.shape(), (Shape{B, S, qkv.local_kv_size()}));
      Tensor y = add(h, o_proj.forward(add(q, mul(sum(add(k, v), {-1}, true), 1.0))));
      EXPECT_EQ(y.shape(), (Shape{B, S / tp, HID}));
      Tensor logits = head.forward(y);
      EXPECT_EQ(logits.shape(), (Shape{B, S, V / tp}));
      ParallelCrossEntropyOptions po;
      po.reduction = Reduction::mean;
      Tensor loss = parallel_cross_entropy(logits, ids, po);
      EXPECT_TRUE(loss.is_meta());
      backward(loss);
      for (Module* m : std::initializer_list<Module*>{&emb, &norm, &qkv, &o_proj, &head})
        for (auto& [n, t] : m->named_parameters()) {
          ASSERT_TRUE(t.grad().defined()) << m->type_name() << " " << n;
          EXPECT_TRUE(t.grad().is_meta());
          EXPECT_EQ(t.grad().shape(), t.shape()) << n;
        }
    });
  }
}

}  // namespace
