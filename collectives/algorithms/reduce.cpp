// The reduction kernels shared by the backends and the point-to-point algorithms
// (algorithms/reduce.h).
#include "nxd/collectives/algorithms/reduce.h"

#include <cstring>
#include <optional>
#include <type_traits>

#include "nxd/collectives/communicator.h"

namespace nxd {

namespace {
// Two sources into one or two destinations (a 2-rank all-reduce, the common case): one fused
// pass, no accumulator. Same arithmetic as reduce_typed: (s0 op s1), then / divide_by (avg).
template <class T, class A, int ND, class Op>
void reduce_pair(void* const* dsts, const void* const* srcs, int64_t count, Op op,
                 std::optional<A> divide_by) {
  const T* s0 = static_cast<const T*>(srcs[0]);
  const T* s1 = static_cast<const T*>(srcs[1]);
  T* d0 = static_cast<T*>(dsts[0]);
  T* d1 = static_cast<T*>(dsts[ND - 1]);
  auto ld = [](const T* p, int64_t i) -> A {
    if constexpr (std::is_same_v<T, bf16>)
      return bf16::to_f32(p[i].bits);
    else
      return p[i];
  };
  auto st = [](T* p, int64_t i, A v) {
    if constexpr (std::is_same_v<T, bf16>)
      p[i].bits = bf16::from_f32(v);
    else
      p[i] = v;
  };
  // Destinations may alias the sources, but only at the same offsets: element i is read before
  // it is written and no iteration touches another's elements, so there is no loop-carried
  // dependence (ivdep lets the compiler vectorize without runtime overlap checks).
  if (divide_by) {
    const A div = *divide_by;
#pragma GCC ivdep
    for (int64_t i = 0; i < count; ++i) {
      const A v = op(ld(s0, i), ld(s1, i)) / div;
      st(d0, i, v);
      if constexpr (ND == 2) st(d1, i, v);
    }
  } else {
#pragma GCC ivdep
    for (int64_t i = 0; i < count; ++i) {
      const A v = op(ld(s0, i), ld(s1, i));
      st(d0, i, v);
      if constexpr (ND == 2) st(d1, i, v);
    }
  }
}

template <class T, class A, class Op>
void reduce_pair_nd(void* const* dsts, int nd, const void* const* srcs, int64_t count, Op op,
                    std::optional<A> divide_by) {
  if (nd == 1)
    reduce_pair<T, A, 1>(dsts, srcs, count, op, divide_by);
  else
    reduce_pair<T, A, 2>(dsts, srcs, count, op, divide_by);
}

// One pass over `count` elements in L1-sized blocks: the block of every source is combined into
// an accumulator (source order, in A), then stored to every destination. Destinations may alias
// sources at the same offsets (each block is read completely before it is written).
template <class T, class A>
void reduce_typed(void* const* dsts, int nd, const void* const* srcs, int ns, int64_t count,
                  ReduceOp op, int divisor) {
  if (ns == 2 && nd <= 2) {
    const bool avg = op == ReduceOp::avg && std::is_floating_point_v<A>;
    const std::optional<A> divide_by =
        avg ? std::optional<A>(static_cast<A>(divisor)) : std::nullopt;
    if (op == ReduceOp::sum || op == ReduceOp::avg)
      return reduce_pair_nd<T, A>(
          dsts, nd, srcs, count, [](A x, A y) { return x + y; }, divide_by);
    if (op == ReduceOp::max)
      return reduce_pair_nd<T, A>(
          dsts, nd, srcs, count, [](A x, A y) { return y > x ? y : x; }, std::nullopt);
    return reduce_pair_nd<T, A>(
        dsts, nd, srcs, count, [](A x, A y) { return y < x ? y : x; }, std::nullopt);
  }
  constexpr int64_t kBlock = 2048;
  alignas(64) A acc[kBlock];
  auto ld = [](const T* __restrict p, int64_t i) -> A {
    if constexpr (std::is_same_v<T, bf16>)
      return bf16::to_f32(p[i].bits);
    else
      return p[i];
  };
  const bool add = op == ReduceOp::sum || op == ReduceOp::avg;
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t n = std::min(kBlock, count - b);
    const T* __restrict s0 = static_cast<const T*>(srcs[0]) + b;
    int k = 1;
    if (ns >= 2) {  // the first two sources in one loop
      const T* __restrict s1 = static_cast<const T*>(srcs[1]) + b;
      if (add) {
        for (int64_t i = 0; i < n; ++i) acc[i] = ld(s0, i) + ld(s1, i);
      } else if (op == ReduceOp::max) {
        for (int64_t i = 0; i < n; ++i) {
          A x = ld(s0, i), y = ld(s1, i);
          acc[i] = y > x ? y : x;
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          A x = ld(s0, i), y = ld(s1, i);
          acc[i] = y < x ? y : x;
        }
      }
      k = 2;
    } else {
      for (int64_t i = 0; i < n; ++i) acc[i] = ld(s0, i);
    }
    for (; k < ns; ++k) {
      const T* __restrict s = static_cast<const T*>(srcs[k]) + b;
      if (add) {
        for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] + ld(s, i);
      } else if (op == ReduceOp::max) {
        for (int64_t i = 0; i < n; ++i) {
          A v = ld(s, i);
          acc[i] = v > acc[i] ? v : acc[i];
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          A v = ld(s, i);
          acc[i] = v < acc[i] ? v : acc[i];
        }
      }
    }
    if (op == ReduceOp::avg) {
      if constexpr (std::is_floating_point_v<A>) {
        const A d = static_cast<A>(divisor);
        for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] / d;
      }
    }
    for (int j = 0; j < nd; ++j) {
      T* __restrict o = static_cast<T*>(dsts[j]) + b;
      if constexpr (std::is_same_v<T, bf16>) {
        for (int64_t i = 0; i < n; ++i) o[i].bits = bf16::from_f32(acc[i]);
      } else {
        std::memcpy(o, acc, n * sizeof(T));
      }
    }
  }
}
}  // namespace

void reduce_buffers_to(std::span<void* const> dst_span, std::span<const void* const> src_span,
                       int64_t count, const ReduceSpec& r) {
  NXD_INTERNAL_CHECK(!src_span.empty(), "reduce_buffers without sources");
  if (count <= 0 || dst_span.empty()) return;
  void* const* dsts = dst_span.data();
  const void* const* srcs = src_span.data();
  const int nd = static_cast<int>(dst_span.size()), ns = static_cast<int>(src_span.size());
  const ReduceOp op = r.op;
  const int divisor = r.divisor;
  switch (r.dtype) {
    case DType::f32:
      return reduce_typed<float, float>(dsts, nd, srcs, ns, count, op, divisor);
    case DType::bf16:
      return reduce_typed<bf16, float>(dsts, nd, srcs, ns, count, op, divisor);
    case DType::f64:
      return reduce_typed<double, double>(dsts, nd, srcs, ns, count, op, divisor);
    case DType::i32:
      return reduce_typed<int32_t, int32_t>(dsts, nd, srcs, ns, count, op, divisor);
    case DType::i64:
      return reduce_typed<int64_t, int64_t>(dsts, nd, srcs, ns, count, op, divisor);
  }
}

void reduce_buffers(void* dst, std::initializer_list<const void*> srcs, int64_t count,
                    const ReduceSpec& r) {
  reduce_buffers_to({&dst, 1}, {srcs.begin(), srcs.size()}, count, r);
}

}  // namespace nxd
