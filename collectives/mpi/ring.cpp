#include "nxd/collectives/mpi/ring.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace nxd::mpi::detail {
namespace {

// The two message streams of a call (on the ring's own communicator, so they never meet a
// user's point-to-point tags); messages of one stream arrive in posting order.
constexpr int kTagReduce = 1, kTagGather = 2;

int mod(int a, int p) {
  return ((a % p) + p) % p;
}

// Element range [begin, begin + len) of chunk k: uneven (all_reduce: algorithms::chunk_range's
// split) or `per` elements each (reduce_scatter, all_gather).
struct Chunks {
  int64_t count = 0, per = 0;
  int p = 1;
  bool uniform = false;
  std::pair<int64_t, int64_t> operator()(int k) const {
    if (uniform) return {k * per, per};
    const int64_t base = count / p, extra = count % p;
    return {k * base + std::min<int64_t>(k, extra), base + (k < extra ? 1 : 0)};
  }
};

class Ring {
 public:
  Ring(const RingComm& rc, DType t)
      : rc_(rc),
        t_(t),
        es_(dtype_size(t)),
        se_(std::max<int64_t>(1, rc.chunk_bytes / dtype_size(t))),
        next_(mod(rc.rank + 1, rc.size)),
        prev_(mod(rc.rank - 1, rc.size)) {
    const size_t need = size_t(rc.depth) * se_ * es_;
    if (rc.scratch->size() < need) rc.scratch->resize(need);  // zero-filled: touched once
  }
  int p() const { return rc_.size; }
  int r() const { return rc_.rank; }
  int64_t es() const { return es_; }
  int64_t se() const { return se_; }
  int64_t segments(int64_t n) const { return (n + se_ - 1) / se_; }
  int64_t seg_len(int64_t n, int64_t j) const { return std::min(se_, n - j * se_); }
  char* slot(int64_t j) const { return rc_.scratch->data() + (j % rc_.depth) * se_ * es_; }

  void isend(const char* b, int64_t n, int tag, std::vector<MPI_Request>& into) {
    MPI_Request q;
    check(MPI_Isend(b, static_cast<int>(n * es_), MPI_BYTE, next_, tag, rc_.comm, &q), "MPI_Isend");
    into.push_back(q);
  }
  void irecv(char* b, int64_t n, int tag, MPI_Request* q) {
    check(MPI_Irecv(b, static_cast<int>(n * es_), MPI_BYTE, prev_, tag, rc_.comm, q), "MPI_Irecv");
  }
  void wait(MPI_Request* q) { check(MPI_Wait(q, MPI_STATUS_IGNORE), "MPI_Wait"); }
  void wait_all(std::vector<MPI_Request>& qs) {
    if (!qs.empty())
      check(MPI_Waitall(static_cast<int>(qs.size()), qs.data(), MPI_STATUSES_IGNORE),
            "MPI_Waitall");
    qs.clear();
  }

  // The reduce-scatter steps. Step s (0 <= s < p-1) sends chunk first - s and reduces chunk
  // first - s - 1: own(k) is this rank's input of chunk k, out(k, s) where step s's partial of
  // it goes (the final value at s = p-2). Each reduced segment is sent on at once: as the next
  // step's message, or after the last step as the first all-gather message when `then_gather`
  // (into gather_sends). `reuses_partials`: out() alternates two buffers, so step s waits for
  // the sends of the partial it overwrites.
  template <class Own, class Out>
  void reduce_scatter(const Chunks& ch, int first, Own own, Out out, ReduceOp op, bool then_gather,
                      bool reuses_partials, std::vector<MPI_Request>& gather_sends) {
    const int P = p();
    std::vector<std::vector<MPI_Request>> sends(P);  // by the step they belong to
    {
      auto [b, n] = ch(first);
      for (int64_t j = 0; j < segments(n); ++j)
        isend(own(first) + j * se_ * es_, seg_len(n, j), kTagReduce, sends[0]);
    }
    std::vector<MPI_Request> rq(rc_.depth, MPI_REQUEST_NULL);
    const ReduceOp step_op = op == ReduceOp::avg ? ReduceOp::sum : op;
    for (int s = 0; s < P - 1; ++s) {
      const int k = mod(first - s - 1, P);
      const bool last = s == P - 2;
      if (reuses_partials && s >= 2) wait_all(sends[s - 1]);
      auto [b, n] = ch(k);
      const char* mine = own(k);
      char* o = out(k, s);
      const int64_t ns = segments(n);
      for (int64_t j = 0; j < std::min<int64_t>(rc_.depth, ns); ++j)
        irecv(slot(j), seg_len(n, j), kTagReduce, &rq[j % rc_.depth]);
      for (int64_t j = 0; j < ns; ++j) {
        wait(&rq[j % rc_.depth]);
        const int64_t len = seg_len(n, j), off = j * se_ * es_;
        reduce_buffers(o + off, {slot(j), mine + off}, len,
                       {t_, last && op == ReduceOp::avg ? ReduceOp::avg : step_op, P});
        if (j + rc_.depth < ns)
          irecv(slot(j), seg_len(n, j + rc_.depth), kTagReduce, &rq[j % rc_.depth]);
        if (!last)
          isend(o + off, len, kTagReduce, sends[s + 1]);
        else if (then_gather)
          isend(o + off, len, kTagGather, gather_sends);
      }
    }
    for (auto& v : sends) wait_all(v);
  }

  // The all-gather steps: this rank holds chunk `held` of `at` (chunk k at at(k)); step u sends
  // chunk held - u and receives chunk held - u - 1, forwarding each segment as it arrives.
  // `sends` already holds step 0's messages when they were posted earlier.
  template <class At>
  void all_gather(const Chunks& ch, int held, At at, std::vector<MPI_Request>& sends) {
    const int P = p();
    struct Seg {
      char* b;
      int64_t n;
      bool forward;
    };
    std::vector<Seg> segs;
    for (int u = 0; u < P - 1; ++u) {
      const int k = mod(held - u - 1, P);
      auto [b, n] = ch(k);
      for (int64_t j = 0; j < segments(n); ++j)
        segs.push_back({at(k) + j * se_ * es_, seg_len(n, j), u < P - 2});
    }
    std::vector<MPI_Request> rq(segs.size());
    for (size_t i = 0; i < segs.size(); ++i) irecv(segs[i].b, segs[i].n, kTagGather, &rq[i]);
    for (size_t i = 0; i < segs.size(); ++i) {
      wait(&rq[i]);
      if (segs[i].forward) isend(segs[i].b, segs[i].n, kTagGather, sends);
    }
    wait_all(sends);
  }

 private:
  void check(int rc, const char* call) const {
    if (rc == MPI_SUCCESS) return;
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    throw CommError(
        str("[mpi ring] ", call, " failed on ", rc_.what, " (", t_, "): ", std::string(s, len)));
  }

  const RingComm& rc_;
  DType t_;
  int64_t es_, se_;
  int next_, prev_;
};

}  // namespace

void ring_all_reduce(const RingComm& rc, const void* send, void* recv, int64_t count, DType t,
                     ReduceOp op) {
  if (t == DType::bf16) {  // partial sums travel in f32; one rounding at the end
    if (rc.widened->size() < size_t(count) * 4) rc.widened->resize(size_t(count) * 4);
    float* f = reinterpret_cast<float*>(rc.widened->data());
    bf16_to_f32(f, static_cast<const uint16_t*>(send), count);
    ring_all_reduce(rc, f, f, count, DType::f32, op);
    f32_to_bf16(static_cast<uint16_t*>(recv), f, count);
    return;
  }
  Ring R(rc, t);
  const Chunks ch{.count = count, .p = rc.size};
  const char* src = static_cast<const char*>(send);
  char* dst = static_cast<char*>(recv);
  const int64_t es = R.es();
  auto own = [&](int k) { return src + ch(k).first * es; };
  auto at = [&](int k) { return dst + ch(k).first * es; };
  std::vector<MPI_Request> gather_sends;
  // Rank r ends the reduce-scatter holding chunk r + 1 (first send: its own chunk r).
  R.reduce_scatter(
      ch, rc.rank, own, [&](int k, int) { return at(k); }, op, /*then_gather=*/true,
      /*reuses_partials=*/false, gather_sends);
  R.all_gather(ch, mod(rc.rank + 1, rc.size), at, gather_sends);
}

void ring_reduce_scatter(const RingComm& rc, const void* send, void* recv, int64_t count, DType t,
                         ReduceOp op) {
  if (t == DType::bf16) {  // as ring_all_reduce: f32 partials, one rounding
    const size_t total = size_t(count) * rc.size;
    if (rc.widened->size() < (total + count) * 4) rc.widened->resize((total + count) * 4);
    float* f = reinterpret_cast<float*>(rc.widened->data());
    bf16_to_f32(f, static_cast<const uint16_t*>(send), total);
    ring_reduce_scatter(rc, f, f + total, count, DType::f32, op);
    f32_to_bf16(static_cast<uint16_t*>(recv), f + total, count);
    return;
  }
  Ring R(rc, t);
  const Chunks ch{.per = count, .p = rc.size, .uniform = true};
  const char* src = static_cast<const char*>(send);
  char* dst = static_cast<char*>(recv);
  const int64_t bytes = count * R.es();
  if (rc.size > 2 && rc.partials->size() < size_t(2 * bytes)) rc.partials->resize(2 * bytes);
  char* partial = rc.partials->data();
  std::vector<MPI_Request> none;
  // Rank r ends holding chunk r: the first message is chunk r - 1.
  R.reduce_scatter(
      ch, mod(rc.rank - 1, rc.size), [&](int k) { return src + k * bytes; },
      [&](int, int s) { return s == rc.size - 2 ? dst : partial + (s % 2) * bytes; }, op,
      /*then_gather=*/false, /*reuses_partials=*/true, none);
}

void ring_all_gather(const RingComm& rc, const void* send, void* recv, int64_t count, DType t) {
  Ring R(rc, t);
  const Chunks ch{.per = count, .p = rc.size, .uniform = true};
  char* dst = static_cast<char*>(recv);
  const int64_t bytes = count * R.es();
  const char* src = static_cast<const char*>(send);
  char* mine = dst + rc.rank * bytes;
  std::vector<MPI_Request> sends;
  for (int64_t j = 0; j < R.segments(count); ++j)
    R.isend(src + j * R.se() * R.es(), R.seg_len(count, j), kTagGather, sends);
  if (src != mine) std::memcpy(mine, src, bytes);
  R.all_gather(
      ch, rc.rank, [&](int k) { return dst + k * bytes; }, sends);
}

}  // namespace nxd::mpi::detail
