#include "support/compare.h"

#include <cmath>
#include <cstring>

namespace nxd::testing {

std::string Diff::str() const {
  return nxd::str("max|a-b|=", max_abs, " at flat index ", worst, ", max|b|=", max_ref,
                  ", relative=", rel());
}

Diff diff(const Tensor& a, const Tensor& b) {
  NXD_CHECK_SHAPE(a.shape() == b.shape(), "[diff] shapes differ: ", a.desc(), " vs ", b.desc());
  auto va = a.to_vector(), vb = b.to_vector();
  Diff d;
  for (size_t i = 0; i < va.size(); ++i) {
    double e = std::fabs(va[i] - vb[i]);
    if (std::isnan(va[i]) != std::isnan(vb[i])) e = INFINITY;
    if (std::isnan(va[i]) && std::isnan(vb[i])) e = 0;
    if (e > d.max_abs || d.worst < 0) {
      if (e > d.max_abs) d.max_abs = e;
      if (e >= d.max_abs) d.worst = static_cast<int64_t>(i);
    }
    d.max_ref = std::max(d.max_ref, std::fabs(vb[i]));
  }
  return d;
}

::testing::AssertionResult close_rel(const Tensor& a, const Tensor& b, double tol,
                                     const std::string& what) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure()
           << what << ": shapes differ " << a.desc() << " vs " << b.desc();
  Diff d = diff(a, b);
  if (d.rel() <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << " " << a.desc() << ": " << d.str() << " > tol " << tol;
}

::testing::AssertionResult allclose(const Tensor& a, const Tensor& b, double rtol, double atol,
                                    const std::string& what) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure()
           << what << ": shapes differ " << a.desc() << " vs " << b.desc();
  auto va = a.to_vector(), vb = b.to_vector();
  double worst = 0;
  int64_t wi = -1;
  for (size_t i = 0; i < va.size(); ++i) {
    double excess = std::fabs(va[i] - vb[i]) - (atol + rtol * std::fabs(vb[i]));
    if (std::isnan(va[i]) || std::isnan(vb[i]))
      excess = std::isnan(va[i]) && std::isnan(vb[i]) ? 0 : INFINITY;
    if (excess > worst) worst = excess, wi = static_cast<int64_t>(i);
  }
  if (wi < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << " " << a.desc() << ": element " << wi << " is " << va[wi] << " vs " << vb[wi]
         << " (" << diff(a, b).str() << ")";
}

::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b,
                                         const std::string& what) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << what << ": " << a.desc() << " vs " << b.desc();
  Tensor ca = a.detach().contiguous(), cb = b.detach().contiguous();
  if (ca.nbytes() == 0 ||  // empty tensors have no storage pointer
      std::memcmp(ca.raw_data(), cb.raw_data(), static_cast<size_t>(ca.nbytes())) == 0)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " not bitwise equal: " << diff(a, b).str();
}

}  // namespace nxd::testing
