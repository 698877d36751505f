// The MPI backend (built when NXD_WITH_MPI; mpi/no_mpi.cpp otherwise).
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "nxd/collectives/mpi/datatype.h"
#include "nxd/collectives/mpi/mpi.h"
#include "nxd/collectives/mpi/transport.h"

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

// One MPI request, owned: a Work dropped without wait() does not leak it. A dropped receive is
// cancelled (its buffer may be gone, and a posted receive would take a later message); a dropped
// send is released to complete on its own (MPI_Request_free); a dropped collective is completed
// (it cannot be cancelled, and the other members are in it), then its `done` step runs.
class RequestWork : public Work::Impl {
 public:
  enum class Kind : uint8_t { collective, send, recv };
  struct Request {
    MPI_Request req = MPI_REQUEST_NULL;
    Kind kind = Kind::collective;
    std::function<void()> done;  // after completion (avg's division), also when dropped
  };
  RequestWork(Request r, std::string what)
      : req_(r.req), kind_(r.kind), done_(std::move(r.done)), what_(std::move(what)) {}
  ~RequestWork() override {
    if (finished_ || req_ == MPI_REQUEST_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    switch (kind_) {
      case Kind::recv:
        MPI_Cancel(&req_);
        MPI_Wait(&req_, MPI_STATUS_IGNORE);
        break;
      case Kind::send:
        MPI_Request_free(&req_);
        break;
      case Kind::collective:
        if (MPI_Wait(&req_, MPI_STATUS_IGNORE) == MPI_SUCCESS && done_) {
          try {
            done_();
          } catch (...) {  // a destructor must not throw; the values stay as MPI left them
          }
        }
        break;
    }
  }
  void wait() override {
    if (finished_) return;
    finished_ = true;
    int rc = MPI_Wait(&req_, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      char s[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, s, &len);
      throw CommError(str(what_, ": MPI error: ", std::string(s, len)));
    }
    if (done_) done_();
  }
  bool test() override {
    if (finished_) return true;
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    if (flag) {
      finished_ = true;
      if (done_) done_();
    }
    return flag != 0;
  }

 private:
  MPI_Request req_;
  Kind kind_;
  std::function<void()> done_;
  std::string what_;
  bool finished_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, std::vector<int> ranks, bool owned)
      : Communicator(rank, std::move(ranks)), comm_(comm), owned_(owned) {
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
    check(MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, icount("all_reduce", n), datatype(t),
                        mpi_op(op, t), comm_),
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
    check(MPI_Allgather(s == mine ? MPI_IN_PLACE : s, icount("all_gather", n), datatype(t), r,
                        icount("all_gather", n), datatype(t), comm_),
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
    check(MPI_Reduce_scatter_block(s, r, icount("reduce_scatter", n), datatype(t), mpi_op(op, t),
                                   comm_),
          {"reduce_scatter", n, t});
    if (op == ReduceOp::avg) divide(r, n, t);
  }
  void broadcast(void* b, int64_t n, DType t, int root) override {
    check_count("broadcast", n);
    check_member("broadcast", "root", root);
    if (!b) return;
    check(MPI_Bcast(b, icount("broadcast", n), datatype(t), root, comm_), {"broadcast", n, t});
  }
  void reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op, int root) override {
    check_reduction("reduce", n, {t, op});
    check_member("reduce", "root", root);
    if (!s) return;
    const void* snd = (rank() == root && s == r) ? MPI_IN_PLACE : s;
    check(MPI_Reduce(snd, r, icount("reduce", n), datatype(t), mpi_op(op, t), root, comm_),
          {"reduce", n, t});
    if (op == ReduceOp::avg && rank() == root) divide(r, n, t);
  }
  void all_to_all(const void* s, void* r, int64_t n, DType t) override {
    check_count("all_to_all", n);
    NXD_CHECK(!s || s != r, "[all_to_all] in-place all_to_all is not supported");
    if (!r) return;
    check(MPI_Alltoall(s, icount("all_to_all", n), datatype(t), r, icount("all_to_all", n),
                       datatype(t), comm_),
          {"all_to_all", n, t});
  }
  void send(const void* b, int64_t n, DType t, int dst, int tag) override {
    check_member("send", "destination", dst);
    if (!b) return;
    check(MPI_Send(b, icount("send", n), datatype(t), dst, tag, comm_), {"send", n, t});
  }
  void recv(void* b, int64_t n, DType t, int src, int tag) override {
    check_member("recv", "source", src);
    if (!b) return;
    MPI_Status st;
    check(MPI_Recv(b, icount("recv", n), datatype(t), src, tag, comm_, &st), {"recv", n, t});
    int got = 0;
    MPI_Get_count(&st, datatype(t), &got);
    NXD_CHECK_T(CommError, got == n, "[recv] rank ", ranks()[rank()], " expected ", t, " count ", n,
                " from rank ", ranks()[src], " (tag ", tag, ", group ", group_str(),
                "), got count ", got);
  }
  void barrier() override { check(MPI_Barrier(comm_), {"barrier", 0, DType::f32}); }

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
    return work({req, RequestWork::Kind::send}, "isend");
  }
  Work irecv(void* b, int64_t n, DType t, int src, int tag) override {
    check_member("irecv", "source", src);
    if (!b) return Work();
    MPI_Request req;
    check(MPI_Irecv(b, icount("irecv", n), datatype(t), src, tag, comm_, &req), {"irecv", n, t});
    return work({req, RequestWork::Kind::recv}, "irecv");
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
    return std::make_shared<MpiCommunicator>(nc, r, std::move(globals), true);
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
  Work work(RequestWork::Request q, const char* op) const {
    return Work(std::make_shared<RequestWork>(
        std::move(q), str("[", op, "] group ", group_str(), " rank ", ranks()[rank()])));
  }
  detail::MpiTransport transport(const char* op) {
    const Tuning tu = tuning();
    return detail::MpiTransport(
        {.comm = p2p_comm_,
         .rank = rank(),
         .size = size(),
         .pipeline = {.segment_bytes = tu.chunk_bytes, .depth = tu.depth},
         .scratch = &scratch_,
         .what = str(op, " on group ", group_str(), " rank ", ranks()[rank()])});
  }
  MPI_Comm comm_;
  MPI_Comm p2p_comm_ = MPI_COMM_NULL;
  bool owned_;
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
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  std::set_terminate(terminate_handler);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
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
  set_world(*ctx_, std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, r, all, false));
  guard_ = std::make_unique<ContextGuard>(*ctx_);
}

Session::~Session() {
  guard_.reset();
  ctx_.reset();  // frees sub-communicators before MPI_Finalize
  MPI_Op_free(&g_bf16_sum);
  MPI_Op_free(&g_bf16_max);
  MPI_Op_free(&g_bf16_min);
  MPI_Type_free(&g_bf16);
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
