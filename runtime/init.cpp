#include "nxd/runtime/init.h"

#include <cmath>

namespace nxd::init {

// Calls f(element pointer offset, global index) for every element of t.
template <class F>
static void for_each_global(const Tensor& t, const Region* region, F&& f) {
  const Shape& sh = t.shape();
  int64_t nd = t.dim();
  Shape full = region ? region->full_shape : sh;
  Shape start = region ? region->start : Shape(nd, 0);
  NXD_CHECK_SHAPE(
      static_cast<int64_t>(full.size()) == nd && static_cast<int64_t>(start.size()) == nd,
      "[init] region ", shape_str(full), " start ", shape_str(start), " does not match ", t.desc());
  for (int64_t d = 0; d < nd; ++d)
    NXD_CHECK_SHAPE(start[d] >= 0 && start[d] + sh[d] <= full[d], "[init] block ", t.desc(), " at ",
                    shape_str(start), " exceeds full shape ", shape_str(full));
  Shape gstride = contiguous_strides(full);
  int64_t gbase = 0;
  for (int64_t d = 0; d < nd; ++d) gbase += start[d] * gstride[d];
  for_each_run(sh, t.strides(), gstride,
               [&](int64_t a, int64_t g, int64_t n, int64_t as, int64_t gs) {
                 for (int64_t i = 0; i < n; ++i)
                   f(a + i * as, static_cast<uint64_t>(gbase + g + i * gs));
               });
}

template <class G>
static void fill(const Tensor& t, const Region* region, G&& gen) {
  if (t.is_meta()) return;
  Tensor d = t.detach();
  dispatch(d.dtype(), [&]<class T>() {
    T* p = static_cast<T*>(d.raw_data());
    for_each_global(d, region, [&](int64_t off, uint64_t gi) { p[off] = from_double<T>(gen(gi)); });
  });
}

void uniform(const Tensor& t, const RngStream& s, double lo, double hi, const Region* region) {
  NXD_CHECK(lo <= hi, "[init::uniform] lo ", lo, " > hi ", hi);
  fill(t, region, [&](uint64_t i) { return lo + (hi - lo) * s.uniform_f64(i); });
}

void normal(const Tensor& t, const RngStream& s, double mean, double std, const Region* region) {
  NXD_CHECK(std >= 0, "[init::normal] negative std ", std);
  fill(t, region, [&](uint64_t i) { return mean + std * s.normal(i); });
}

void kaiming_uniform(const Tensor& t, const RngStream& s, int64_t fan_in, double a,
                     const Region* region) {
  NXD_CHECK(fan_in > 0, "[init::kaiming_uniform] fan_in must be > 0, got ", fan_in);
  double gain = std::sqrt(2.0 / (1.0 + a * a));
  double bound = gain * std::sqrt(3.0 / static_cast<double>(fan_in));
  uniform(t, s, -bound, bound, region);
}

void xavier_uniform(const Tensor& t, const RngStream& s, int64_t fan_in, int64_t fan_out,
                    double gain, const Region* region) {
  NXD_CHECK(fan_in + fan_out > 0, "[init::xavier_uniform] fan_in + fan_out must be > 0");
  double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  uniform(t, s, -bound, bound, region);
}

}  // namespace nxd::init
