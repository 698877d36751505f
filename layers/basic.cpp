#include "nxd/layers/basic.h"

namespace nxd {

Linear::Linear(int64_t in_features, int64_t out_features, const LinearOptions& opts)
    : Module("Linear"), in_(in_features), out_(out_features) {
  NXD_CHECK(in_features > 0 && out_features > 0,
            "[Linear] sizes must be positive, got in=", in_features, " out=", out_features);
  const auto& p = opts.param;
  weight_ = register_parameter("weight", zeros({out_, in_}, p.dtype, p.device),
                               opts.weight_init.for_fan_in(in_));
  if (opts.bias)
    bias_ = register_parameter("bias", zeros({out_}, p.dtype, p.device),
                               opts.bias_init.for_fan_in(in_));
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, const EmbeddingOptions& opts)
    : Module("Embedding"), num_embeddings_(num_embeddings), dim_(dim) {
  NXD_CHECK(num_embeddings > 0 && dim > 0,
            "[Embedding] sizes must be positive, got num=", num_embeddings, " dim=", dim);
  const auto& p = opts.param;
  weight_ = register_parameter("weight", zeros({num_embeddings_, dim_}, p.dtype, p.device),
                               opts.weight_init);
}

Norm::Norm(const char* type, int64_t dim, double eps, bool sp, const ParamOptions& p)
    : ParallelModule(type), eps_(eps), sequence_parallel_enabled_(sp) {
  NXD_CHECK(dim > 0 && eps > 0, "[", type, "] need dim > 0 and eps > 0, got dim=", dim,
            " eps=", eps);
  weight_ = register_parameter("weight", ones({dim}, p.dtype, p.device), ParamInit::ones());
  ParallelAttrs a;
  a.sequence_parallel_enabled = sp;
  set_parallel_attrs("weight", a);
}

Tensor Norm::add_bias(int64_t dim, const ParamOptions& p) {
  Tensor b = register_parameter("bias", zeros({dim}, p.dtype, p.device), ParamInit::zeros());
  ParallelAttrs a;
  a.sequence_parallel_enabled = sequence_parallel_enabled_;
  set_parallel_attrs("bias", a);
  return b;
}

LayerNorm::LayerNorm(int64_t dim, const LayerNormOptions& o)
    : Norm("LayerNorm", dim, o.eps, o.sequence_parallel_enabled, o.param) {
  if (o.bias) bias_ = add_bias(dim, o.param);
}

RMSNorm::RMSNorm(int64_t dim, const RMSNormOptions& o)
    : Norm("RMSNorm", dim, o.eps, o.sequence_parallel_enabled, o.param) {}

Dropout::Dropout(double p) : Module("Dropout"), p_(p) {
  NXD_CHECK(p >= 0.0 && p < 1.0, "[Dropout] p must be in [0, 1), got ", p);
}

}  // namespace nxd
