// The MPI backend (built when NXD_WITH_MPI; mpi/no_mpi.cpp otherwise).
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "nxd/collectives/mpi/datatype.h"
#include "nxd/collectives/mpi/mpi.h"
#include "nxd/collectives/mpi/request_work.h"
#include "nxd/collectives/mpi/transport.h"
#include "nxd/collectives/mpi/watchdog.h"

namespace nxd::mpi {
namespace {

MPI_Datatype g_bf16 = MPI_DATATYPE_NULL;
MPI_Op g_bf16_sum = MPI_OP_NULL, g_bf16_max = MPI_OP_NULL, g_bf16_min = MPI_OP_NULL;
int g_world_rank = 0;

template <int kOp>
void bf16_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = bf16::to_f32(a[i]), y = bf16::to_f32(b[i]);
    float r = kOp == 0 ? y + x : kOp == 1 ? (x > y ? x : y) : (x < y ? x : y);
    b[i] = bf16::from_f32(r);
  }
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  if (t == DType::bf16) {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        return g_bf16_sum;
      case ReduceOp::max:
        return g_bf16_max;
      case ReduceOp::min:
        return g_bf16_min;
    }
  }
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

using detail::RequestWork;

// Whether a communicator frees its MPI_Comm (a split's) or borrows it (MPI_COMM_WORLD).
enum class CommOwnership : uint8_t { borrowed, owned };

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, std::vector<int> ranks, CommOwnership ownership)
      : Communicator(rank, std::move(ranks)),
        comm_(comm),
        owned_(ownership == CommOwnership::owned) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    // nxd's algorithms' messages travel on their own communicator (collective: every member
    // constructs its communicator together), so they never match a user's send/recv.
    check(MPI_Comm_dup(comm_, &p2p_comm_), {"MPI_Comm_dup", 0, DType::i32});
    MPI_Comm_set_errhandler(p2p_comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&p2p_comm_);
    if (owned_) MPI_Comm_free(&comm_);
  }
  const char* backend() const override { return "mpi"; }

  void all_reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    check_reduction("all_reduce", n, {t, op});
    if (!r) return;
    if (const Algorithm a = choose(Op::all_reduce, n * dtype_size(t), size());
        a != Algorithm::native) {
      detail::MpiTransport tr = transport("all_reduce");
      return detail::run_all_reduce(a, tr, {s, r, n, t, op});
    }
    const void* in = s == r ? MPI_IN_PLACE : s;
    const int c = icount("all_reduce", n);
    check(run(
              "all_reduce",
              [&] { return MPI_Allreduce(in, r, c, datatype(t), mpi_op(op, t), comm_); },
              [&](MPI_Request* q) {
                return MPI_Iallreduce(in, r, c, datatype(t), mpi_op(op, t), comm_, q);
              }),
          {"all_reduce", n, t});
    if (op == ReduceOp::avg) divide(r, n, t);
  }
  void all_gather(const void* s, void* r, int64_t n, DType t) override {
    check_count("all_gather", n);
    if (!r) return;
    const char* mine = static_cast<const char*>(r) + rank() * n * dtype_size(t);
    if (const Algorithm a = choose(Op::all_gather, size() * n * dtype_size(t), size());
        a != Algorithm::native) {
      detail::MpiTransport tr = transport("all_gather");
      return detail::run_all_gather(a, tr, {s, r, n, t});
    }
    const void* in = s == mine ? MPI_IN_PLACE : s;
    const int c = icount("all_gather", n);
    check(run(
              "all_gather",
              [&] { return MPI_Allgather(in, c, datatype(t), r, c, datatype(t), comm_); },
              [&](MPI_Request* q) {
                return MPI_Iallgather(in, c, datatype(t), r, c, datatype(t), comm_, q);
              }),
          {"all_gather", n, t});
  }
  void reduce_scatter(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    check_reduction("reduce_scatter", n, {t, op});
    if (!r) return;
    const int64_t bytes = size() * n * dtype_size(t);
    const Algorithm a = choose(Op::reduce_scatter, bytes, size());
    std::vector<char> tmp;
    // nxd's algorithms read send and write recv as they go: recv may be this member's own block
    // of send (the in-place form) but must not overlap it elsewhere.
    if (overlaps(s, r, bytes) && !(a != Algorithm::native &&
                                   r == static_cast<const char*>(s) + rank() * n * dtype_size(t))) {
      tmp.assign(static_cast<const char*>(s), static_cast<const char*>(s) + bytes);
      s = tmp.data();
    }
    if (a != Algorithm::native) {
      detail::MpiTransport tr = transport("reduce_scatter");
      return detail::run_reduce_scatter(a, tr, {s, r, n, t, op});
    }
    const int c = icount("reduce_scatter", n);
    check(run(
              "reduce_scatter",
              [&] { return MPI_Reduce_scatter_block(s, r, c, datatype(t), mpi_op(op, t), comm_); },
              [&](MPI_Request* q) {
                return MPI_Ireduce_scatter_block(s, r, c, datatype(t), mpi_op(op, t), comm_, q);
              }),
          {"reduce_scatter", n, t});
    if (op == ReduceOp::avg) divide(r, n, t);
  }
  void broadcast(void* b, int64_t n, DType t, int root) override {
    check_count("broadcast", n);
    check_member("broadcast", "root", root);
    if (!b) return;
    const int c = icount("broadcast", n);
    check(run(
              "broadcast", [&] { return MPI_Bcast(b, c, datatype(t), root, comm_); },
              [&](MPI_Request* q) { return MPI_Ibcast(b, c, datatype(t), root, comm_, q); }),
          {"broadcast", n, t});
  }
  void reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op, int root) override {
    check_reduction("reduce", n, {t, op});
    check_member("reduce", "root", root);
    if (!s) return;
    const void* snd = (rank() == root && s == r) ? MPI_IN_PLACE : s;
    const int c = icount("reduce", n);
    check(run(
              "reduce",
              [&] { return MPI_Reduce(snd, r, c, datatype(t), mpi_op(op, t), root, comm_); },
              [&](MPI_Request* q) {
                return MPI_Ireduce(snd, r, c, datatype(t), mpi_op(op, t), root, comm_, q);
              }),
          {"reduce", n, t});
    if (op == ReduceOp::avg && rank() == root) divide(r, n, t);
  }
  void all_to_all(const void* s, void* r, int64_t n, DType t) override {
    check_count("all_to_all", n);
    NXD_CHECK(!s || s != r, "[all_to_all] in-place all_to_all is not supported");
    if (!r) return;
    const int c = icount("all_to_all", n);
    check(
        run(
            "all_to_all", [&] { return MPI_Alltoall(s, c, datatype(t), r, c, datatype(t), comm_); },
            [&](MPI_Request* q) {
              return MPI_Ialltoall(s, c, datatype(t), r, c, datatype(t), comm_, q);
            }),
        {"all_to_all", n, t});
  }
  void send(const void* b, int64_t n, DType t, int dst, int tag) override {
    check_member("send", "destination", dst);
    if (!b) return;
    const int c = icount("send", n);
    check(
        run(
            "send", [&] { return MPI_Send(b, c, datatype(t), dst, tag, comm_); },
            [&](MPI_Request* q) { return MPI_Isend(b, c, datatype(t), dst, tag, comm_, q); }, dst),
        {"send", n, t});
  }
  void recv(void* b, int64_t n, DType t, int src, int tag) override {
    check_member("recv", "source", src);
    if (!b) return;
    MPI_Status st;
    const int c = icount("recv", n);
    check(run(
              "recv", [&] { return MPI_Recv(b, c, datatype(t), src, tag, comm_, &st); },
              [&](MPI_Request* q) { return MPI_Irecv(b, c, datatype(t), src, tag, comm_, q); }, src,
              &st),
          {"recv", n, t});
    int got = 0;
    MPI_Get_count(&st, datatype(t), &got);
    NXD_CHECK_T(CommError, got == n, "[recv] rank ", ranks()[rank()], " expected ", t, " count ", n,
                " from rank ", ranks()[src], " (tag ", tag, ", group ", group_str(),
                "), got count ", got);
  }
  void barrier() override {
    check(run(
              "barrier", [&] { return MPI_Barrier(comm_); },
              [&](MPI_Request* q) { return MPI_Ibarrier(comm_, q); }),
          {"barrier", 0, DType::f32});
  }

  Work iall_reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    check_reduction("all_reduce", n, {t, op});
    if (!r) return Work();
    if (choose(Op::all_reduce, n * dtype_size(t), size()) != Algorithm::native) {  // runs now
      all_reduce(s, r, n, t, op);
      return Work();
    }
    MPI_Request req;
    check(MPI_Iallreduce(s == r ? MPI_IN_PLACE : s, r, icount("iall_reduce", n), datatype(t),
                         mpi_op(op, t), comm_, &req),
          {"iall_reduce", n, t});
    return work({req, RequestWork::Kind::collective, divide_after(r, n, {t, op})}, "iall_reduce");
  }
  Work iall_gather(const void* s, void* r, int64_t n, DType t) override {
    check_count("all_gather", n);
    if (!r) return Work();
    if (choose(Op::all_gather, size() * n * dtype_size(t), size()) != Algorithm::native) {
      all_gather(s, r, n, t);
      return Work();
    }
    const char* mine = static_cast<const char*>(r) + rank() * n * dtype_size(t);
    MPI_Request req;
    check(MPI_Iallgather(s == mine ? MPI_IN_PLACE : s, icount("iall_gather", n), datatype(t), r,
                         icount("iall_gather", n), datatype(t), comm_, &req),
          {"iall_gather", n, t});
    return work({req, RequestWork::Kind::collective}, "iall_gather");
  }
  Work ireduce_scatter(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    check_reduction("reduce_scatter", n, {t, op});
    if (!r) return Work();
    if (choose(Op::reduce_scatter, size() * n * dtype_size(t), size()) != Algorithm::native) {
      reduce_scatter(s, r, n, t, op);
      return Work();
    }
    const int64_t es = dtype_size(t);
    if (r == static_cast<const char*>(s) + rank() * n * es) {
      // In place (recv is this member's block of send, as ZeRO-1's buckets call it): MPI leaves
      // the result at the start of the buffer; it is moved to this member's block on completion.
      void* base = const_cast<void*>(s);
      MPI_Request req;
      check(MPI_Ireduce_scatter_block(MPI_IN_PLACE, base, icount("ireduce_scatter", n), datatype(t),
                                      mpi_op(op, t), comm_, &req),
            {"ireduce_scatter", n, t});
      std::function<void()> div = divide_after(r, n, {t, op});
      return work({req, RequestWork::Kind::collective,
                   [=] {
                     if (r != base) std::memmove(r, base, static_cast<size_t>(n * es));
                     if (div) div();
                   }},
                  "ireduce_scatter");
    }
    NXD_CHECK(!overlaps(s, r, n * size() * es),
              "[ireduce_scatter] recv overlaps send other than as this member's block");
    MPI_Request req;
    check(MPI_Ireduce_scatter_block(s, r, icount("ireduce_scatter", n), datatype(t), mpi_op(op, t),
                                    comm_, &req),
          {"ireduce_scatter", n, t});
    return work({req, RequestWork::Kind::collective, divide_after(r, n, {t, op})},
                "ireduce_scatter");
  }
  Work ibroadcast(void* b, int64_t n, DType t, int root) override {
    check_member("ibroadcast", "root", root);
    if (!b) return Work();
    MPI_Request req;
    check(MPI_Ibcast(b, icount("ibroadcast", n), datatype(t), root, comm_, &req),
          {"ibroadcast", n, t});
    return work({req, RequestWork::Kind::collective}, "ibroadcast");
  }
  Work isend(const void* b, int64_t n, DType t, int dst, int tag) override {
    check_member("isend", "destination", dst);
    if (!b) return Work();
    MPI_Request req;
    check(MPI_Isend(b, icount("isend", n), datatype(t), dst, tag, comm_, &req), {"isend", n, t});
    return work({req, RequestWork::Kind::send}, "isend", dst);
  }
  Work irecv(void* b, int64_t n, DType t, int src, int tag) override {
    check_member("irecv", "source", src);
    if (!b) return Work();
    MPI_Request req;
    check(MPI_Irecv(b, icount("irecv", n), datatype(t), src, tag, comm_, &req), {"irecv", n, t});
    return work({req, RequestWork::Kind::recv}, "irecv", src);
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    MPI_Comm nc = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &nc),
          {"split", 0, DType::i32});
    if (nc == MPI_COMM_NULL) return nullptr;
    int r = 0, n = 0;
    MPI_Comm_rank(nc, &r);
    MPI_Comm_size(nc, &n);
    std::vector<int> globals(n);
    int me = g_world_rank;
    MPI_Allgather(&me, 1, MPI_INT, globals.data(), 1, MPI_INT, nc);
    return std::make_shared<MpiCommunicator>(nc, r, std::move(globals), CommOwnership::owned);
  }

 private:
  static bool overlaps(const void* a, const void* b, int64_t bytes) {
    auto x = static_cast<const char*>(a), y = static_cast<const char*>(b);
    return x && y && y >= x && y < x + bytes;
  }
  int icount(const char* op, int64_t n) const {
    NXD_CHECK(n <= INT_MAX, "[", op, "] count ", n, " exceeds MPI's int range on group ",
              group_str());
    return static_cast<int>(n);
  }
  // The call an MPI error message names.
  struct What {
    const char* op;
    int64_t count;
    DType dtype;
  };
  void check(int rc, const What& w) const {
    if (rc == MPI_SUCCESS) return;
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    throw CommError(str("[", w.op, "] MPI error on group ", group_str(), " at rank ",
                        ranks()[rank()], " (", w.dtype, ", count ", w.count,
                        "): ", std::string(s, len)));
  }
  // avg: MPI sums; nxd divides once by the group size afterwards (the reduction kernel, one
  // source).
  void divide(void* r, int64_t n, DType t) const {
    if (r) reduce_buffers(r, {r}, n, {t, ReduceOp::avg, size()});
  }
  std::function<void()> divide_after(void* r, int64_t n, const ReduceSpec& red) const {
    if (red.op != ReduceOp::avg) return nullptr;
    const int p = size();
    return [=] { reduce_buffers(r, {r}, n, {red.dtype, ReduceOp::avg, p}); };
  }
  // `peer`: isend/irecv's; -1 for a collective (which takes the next sequence number).
  Work work(RequestWork::Request q, const char* op, int peer = -1) {
    if (peer < 0) ++seq_;
    if (detail::timed()) q.waiting = waiting(op, peer);
    return Work(std::make_shared<RequestWork>(
        std::move(q), str("[", op, "] group ", group_str(), " rank ", ranks()[rank()])));
  }
  // A blocking call: MPI's, or with a collective timeout its nonblocking form and a timed wait
  // (watchdog.h). `peer`: send/recv's; -1 for a collective (which takes the next sequence number).
  template <class Blocking, class Start>
  int run(const char* op, Blocking blocking, Start start, int peer = -1,
          MPI_Status* st = MPI_STATUS_IGNORE) {
    if (peer < 0) ++seq_;
    if (!detail::timed()) return blocking();
    MPI_Request q = MPI_REQUEST_NULL;
    const int rc = start(&q);
    return rc != MPI_SUCCESS ? rc : detail::wait_all(1, &q, waiting(op, peer), st);
  }
  detail::Waiting waiting(const char* op, int peer = -1) const {
    return {.op = op, .group = ranks(), .rank = rank(), .seq = seq_, .peer = peer};
  }
  detail::MpiTransport transport(const char* op) {
    ++seq_;
    const Tuning tu = tuning();
    return detail::MpiTransport(
        {.comm = p2p_comm_,
         .rank = rank(),
         .size = size(),
         .pipeline = {.segment_bytes = tu.chunk_bytes, .depth = tu.depth},
         .scratch = &scratch_,
         .what = str(op, " on group ", group_str(), " rank ", ranks()[rank()]),
         .waiting = detail::timed() ? waiting(op) : detail::Waiting{}});
  }
  MPI_Comm comm_;
  MPI_Comm p2p_comm_ = MPI_COMM_NULL;
  bool owned_;
  int64_t seq_ = 0;  // collectives called on this group (the same on every member)
  // nxd's algorithms' persistent buffers: allocated (and page-faulted) once, reused by every call.
  algorithms::Scratch scratch_;
};

void terminate_handler() {
  std::string msg = "unknown exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      msg = x.what();
    } catch (...) {
    }
  } else {
    msg = "std::terminate called";
  }
  std::fprintf(stderr, "[nxd] rank %d: uncaught exception, aborting the MPI job: %s\n",
               g_world_rank, msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace

MPI_Datatype datatype(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::bf16:
      return g_bf16;
  }
  return MPI_DATATYPE_NULL;
}

Session::Session(int* argc, char*** argv, uint64_t seed) {
  int inited = 0;
  MPI_Initialized(&inited);
  NXD_CHECK_T(ConfigError, !inited,
              "[mpi::Session] MPI is already initialized (one Session per process)");
  set_tuning(tuning_from_env());
  set_collective_timeout_from_env();
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  std::set_terminate(terminate_handler);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  detail::watch_start();
  int r = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  g_world_rank = r;
  MPI_Type_contiguous(2, MPI_BYTE, &g_bf16);
  MPI_Type_commit(&g_bf16);
  MPI_Op_create(&bf16_op<0>, 1, &g_bf16_sum);
  MPI_Op_create(&bf16_op<1>, 1, &g_bf16_max);
  MPI_Op_create(&bf16_op<2>, 1, &g_bf16_min);
  ctx_ = std::make_unique<Context>(
      ContextOptions{.rank = r, .world_size = n, .seed = seed, .name = str("rank ", r)});
  std::vector<int> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  set_world(*ctx_,
            std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, r, all, CommOwnership::borrowed));
  guard_ = std::make_unique<ContextGuard>(*ctx_);
}

Session::~Session() {
  guard_.reset();
  ctx_.reset();  // frees sub-communicators before MPI_Finalize
  MPI_Op_free(&g_bf16_sum);
  MPI_Op_free(&g_bf16_max);
  MPI_Op_free(&g_bf16_min);
  MPI_Type_free(&g_bf16);
  detail::watch_stop();
  MPI_Finalize();
}

int run_or_abort(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[nxd] rank %d: %s\n", g_world_rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}

}  // namespace nxd::mpi
