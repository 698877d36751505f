#pragma once
// Basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout. Sizes are explicit constructor
// arguments; parameters are created zero and filled by Module::init_parameters (by full name).
// Parameter names and layouts follow torch.nn: Linear.weight is [out, in].
#include <cstdint>

#include "nxd/autograd/ops.h"
#include "nxd/layers/module.h"

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
  int64_t num_embeddings() const { return num_; }
  int64_t dim() const { return dim_; }

 private:
  int64_t num_, dim_;
  Tensor weight_;
};

// (x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance, like torch).
class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, double eps = 1e-5, bool bias = true, const ParamOptions& param = {});
  Tensor forward(const Tensor& x) const { return layer_norm(x, weight_, bias_, eps_); }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  double eps() const { return eps_; }

 private:
  double eps_;
  Tensor weight_, bias_;
};

// x / sqrt(mean(x^2) + eps) * weight over the last dim (Llama's RMSNorm).
class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps = 1e-6, const ParamOptions& param = {});
  Tensor forward(const Tensor& x) const { return rms_norm(x, weight_, eps_); }
  const Tensor& weight() const { return weight_; }
  double eps() const { return eps_; }

 private:
  double eps_;
  Tensor weight_;
};

// Inverted dropout while training (mask from the current context's generator); identity in eval
// mode or when p == 0.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.0);
  Tensor forward(const Tensor& x) const {
    return (p_ > 0.0 && is_training()) ? dropout(x, p_, true) : x;
  }
  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace nxd
