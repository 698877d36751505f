#include "nxd/pipeline/sequential.h"

#include "nxd/runtime/error.h"

namespace nxd::pipeline {

std::vector<Tensor> run_piece(const Piece& p, int64_t i, int64_t n, const Tensor& x,
                              const Batch& mb) {
  NXD_CHECK_T(ConfigError, p.module != nullptr, "[pipeline] piece '", p.name,
              "' is not held on this rank");
  std::vector<Tensor> out = p.run(*p.module, x, mb);
  if (i + 1 < n)
    NXD_CHECK_SHAPE(out.size() == 1 && out.front().defined(), "[pipeline] piece '", p.name, "' (",
                    i, " of ", n, ") returns ", out.size(),
                    " tensor(s): every piece but the last returns one activation");
  return out;
}

std::vector<Tensor> PipelineSequential::forward(const Batch& mb) const {
  NXD_CHECK_T(ConfigError, !pieces_.empty(), "[PipelineSequential] ", type_name(),
              " has no pieces");
  const int64_t n = static_cast<int64_t>(pieces_.size());
  Tensor x;
  std::vector<Tensor> out;
  for (int64_t i = 0; i < n; ++i) {
    out = run_piece(pieces_[i], i, n, x, mb);
    if (i + 1 < n) x = out.front();
  }
  return out;
}

}  // namespace nxd::pipeline
