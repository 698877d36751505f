#include "nxd/runtime/init.h"

#include <cmath>

#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::init {

// Throws ShapeError unless t is a block of the region's full shape.
static void check_region(const Tensor& t, const Region* region) {
  if (!region) return;
  const Shape& sh = t.shape();
  const int64_t nd = t.dim();
  const Shape& full = region->full_shape;
  const Shape& start = region->start;
  NXD_CHECK_SHAPE(
      static_cast<int64_t>(full.size()) == nd && static_cast<int64_t>(start.size()) == nd,
      "[init] region ", shape_str(full), " start ", shape_str(start), " does not match ", t.desc());
  for (int64_t d = 0; d < nd; ++d)
    NXD_CHECK_SHAPE(start[d] >= 0 && start[d] + sh[d] <= full[d], "[init] block ", t.desc(), " at ",
                    shape_str(start), " exceeds full shape ", shape_str(full));
}

// Calls f(element pointer offset, global index) for every element of t.
template <class F>
static void for_each_global(const Tensor& t, const Region* region, F&& f) {
  const Shape& sh = t.shape();
  int64_t nd = t.dim();
  Shape full = region ? region->full_shape : sh;
  Shape start = region ? region->start : Shape(nd, 0);
  check_region(t, region);
  Shape gstride = contiguous_strides(full);
  int64_t gbase = 0;
  for (int64_t d = 0; d < nd; ++d) gbase += start[d] * gstride[d];
  for_each_run(sh, t.strides(), gstride,
               [&](int64_t a, int64_t g, int64_t n, int64_t as, int64_t gs) {
                 for (int64_t i = 0; i < n; ++i)
                   f(a + i * as, static_cast<uint64_t>(gbase + g + i * gs));
               });
}

// A contiguous t: p[j] = gen(global index of local element j), over the compute pool in blocks of
// local elements (each element is a pure function of its global index: any split gives the same
// values).
template <class T, class G>
static void fill_contiguous(T* p, const Shape& sh, const Region* region, G&& gen) {
  const int64_t nd = static_cast<int64_t>(sh.size()), n = shape_numel(sh);
  const Shape full = region ? region->full_shape : sh;
  const Shape start = region ? region->start : Shape(sh.size(), 0);
  const Shape gstride = contiguous_strides(full);
  constexpr int64_t kBlock = 4096;
  kernels::for_blocks(n, kBlock, 64, [&](int64_t b, int64_t e) {
    // the multi-index of local element b, and its global offset
    Shape idx(sh.size());
    int64_t rem = b, g = 0;
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = rem % sh[d];
      rem /= sh[d];
    }
    for (int64_t d = 0; d < nd; ++d) g += (start[d] + idx[d]) * gstride[d];
    for (int64_t j = b; j < e; ++j) {
      p[j] = from_double<T>(gen(static_cast<uint64_t>(g)));
      // next local element: carry through the dims, moving the global offset alike
      for (int64_t d = nd - 1; d >= 0; --d) {
        g += gstride[d];
        if (++idx[d] < sh[d]) break;
        g -= sh[d] * gstride[d];
        idx[d] = 0;
      }
    }
  });
}

template <class G>
static void fill(const Tensor& t, const Region* region, G&& gen) {
  if (t.is_meta()) return;
  Tensor d = t.detach();
  dispatch(d.dtype(), [&]<class T>() {
    T* p = static_cast<T*>(d.raw_data());
    if (d.is_contiguous() && d.dim() > 0) {
      check_region(d, region);
      fill_contiguous<T>(p, d.shape(), region, gen);
      return;
    }
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
