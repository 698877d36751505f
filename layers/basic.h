#pragma once
// Basic layers: Linear, Embedding, the norms (LayerNorm, RMSNorm: the same layers with or without
// sequence parallelism), Dropout. Sizes are explicit constructor arguments; parameters are created
// zero and filled by Module::init_parameters (by full name). Parameter names and layouts follow
// torch.nn: Linear.weight is [out, in]. The tensor-parallel Linear and Embedding are in
// layers/parallel/layers.h.
#include <cstdint>

#include "nxd/autograd/ops.h"
#include "nxd/layers/module.h"
#include "nxd/layers/parallel/attributes.h"

namespace nxd {

struct LinearOptions {
  bool bias = true;
  // torch.nn.Linear's defaults: uniform(+-1/sqrt(in)) for both (kaiming_uniform_(a=sqrt(5)))
  ParamInit weight_init = ParamInit::fan_in_uniform();
  ParamInit bias_init = ParamInit::fan_in_uniform();
  ParamOptions param;
};

// y = x @ weight^T + bias; weight [out, in], bias [out]. Cost: one GEMM of 2*N*in*out flops.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, const LinearOptions& opts = {});
  Tensor forward(const Tensor& x) const { return linear(x, weight_, bias_); }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_, out_;
  Tensor weight_, bias_;
};

struct EmbeddingOptions {
  ParamInit weight_init = ParamInit::normal(1.0);  // torch.nn.Embedding's default
  ParamOptions param;
};

// ids [...] (i32/i64) -> weight[ids] [..., dim]; weight [num_embeddings, dim].
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, const EmbeddingOptions& opts = {});
  Tensor forward(const Tensor& ids) const { return embedding(ids, weight_); }
  const Tensor& weight() const { return weight_; }
  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t dim() const { return dim_; }

 private:
  int64_t num_embeddings_, dim_;
  Tensor weight_;
};

// The norms over the last dim (NxD's parallel_layers LayerNorm and modules RMSNorm; torch's
// parameter names and init: weight ones, bias zeros). Under sequence parallelism
// (sequence_parallel_enabled) the norm runs on this rank's sequence shard, so the gradients of its
// TP-duplicated parameters are partial sums: they are tagged sequence_parallel_enabled and
// allreduce_sequence_parallel_gradients() (layers/parallel/attributes.h) sums them over TP. No
// collective in forward or backward. bf16 is computed in f32 and the result cast back (NxD's
// LayerNorm drops that cast under XLA_DOWNCAST_BF16, nxd does not).
class Norm : public ParallelModule {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
  const Tensor& weight() const { return weight_; }
  double eps() const { return eps_; }

 protected:
  // Checks dim and eps (naming `type`) and registers "weight" [dim] (ones).
  Norm(const char* type, int64_t dim, double eps, bool sequence_parallel_enabled,
       const ParamOptions& param);
  // Registers "bias" [dim] (zeros), tagged like the weight.
  Tensor add_bias(int64_t dim, const ParamOptions& param);
  double eps_;
  bool sequence_parallel_enabled_;
  Tensor weight_;
};

struct LayerNormOptions {
  double eps = 1e-5;
  bool bias = true;
  bool sequence_parallel_enabled = false;  // x is this rank's sequence shard (see Norm)
  ParamOptions param;
};

// (x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance, like torch).
class LayerNorm : public Norm {
 public:
  explicit LayerNorm(int64_t dim, const LayerNormOptions& opts = {});
  Tensor forward(const Tensor& x) const override { return layer_norm(x, weight_, bias_, eps_); }
  const Tensor& bias() const { return bias_; }  // undefined without bias

 private:
  Tensor bias_;
};

struct RMSNormOptions {
  double eps = 1e-6;
  bool sequence_parallel_enabled = false;  // x is this rank's sequence shard (see Norm)
  ParamOptions param;
};

// x / sqrt(mean(x^2) + eps) * weight over the last dim (Llama's RMSNorm).
class RMSNorm : public Norm {
 public:
  explicit RMSNorm(int64_t dim, const RMSNormOptions& opts = {});
  Tensor forward(const Tensor& x) const override { return rms_norm(x, weight_, eps_); }
};

// Inverted dropout while training (mask from the current context's generator); identity in eval
// mode or when p == 0.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.0);
  Tensor forward(const Tensor& x) const {
    return (p_ > 0.0 && is_training()) ? dropout(x, p_, /*training=*/true) : x;
  }
  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace nxd
