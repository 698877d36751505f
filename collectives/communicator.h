#pragma once
// Communicator: the one interface every form of parallelism talks through. A communicator is a
// group of ranks (its members are numbered 0..size()-1; ranks() gives their global ranks).
//
// Flat calls are type-erased: pointers, element counts, a dtype (f32, bf16, f64, i32, i64) and a
// reduce op (sum, avg, max, min; avg only for floating dtypes). bf16 is reduced in f32 and
// rounded once (sim, self, algorithms/ring.h, MPI's ring; MPI's own collectives use a user op
// that rounds after each pairwise step).
// Passing the same pointer as send and recv is the in-place form. A call with both pointers null is
// shape-only (used for meta tensors): it is matched against the peers and charged on the simulated
// clock, but moves no data.
//
// Counts: all_gather, reduce_scatter and all_to_all take the per-rank count, so any total count
// works at the flat level; the tensor forms split a dimension and throw ShapeError when it does
// not divide by size().
//
// Determinism: a reduction gives bitwise-identical results on every rank and every run (the sim
// backend reduces each chunk in rank order; nxd's MPI ring in ring order; below its threshold
// MPI relies on MPI's reduction order).
//
// Ordering: members must call collectives on a group in the same order. The non-blocking forms
// return a Work whose wait() completes the call; point-to-point sends are buffered on sim and
// self, and matched by MPI_Isend on MPI (the blocking send may wait for the receiver there).
//
// Errors: CommError naming op, group, rank and counts (mismatched calls, a failed or timed-out
// peer, MPI errors); InvalidArgument / ShapeError for bad arguments.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nxd/collectives/algorithms/reduce.h"  // reduce_buffers*, shared by the backends
#include "nxd/runtime/context.h"
#include "nxd/runtime/dtype.h"
#include "nxd/runtime/tensor.h"

namespace nxd {

// ReduceOp (sum, avg, max, min) is declared with the kernels in algorithms/reduce.h.
const char* reduce_op_name(ReduceOp op);

// Handle on a non-blocking call. A default-constructed Work is already complete. wait() is
// idempotent and rethrows the call's error.
class Work {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;  // true when complete (never blocks)
  };
  Work() = default;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait();
  bool is_completed();
  // Runs `f` after the call completes (in wait()); used to copy results into strided tensors.
  Work then(std::function<void()> f) &&;

 private:
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<std::function<void()>> after_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }  // global rank of each member
  std::string group_str() const;                            // "[0,1,2,3]"
  virtual const char* backend() const = 0;                  // "sim", "mpi", "self"

  // ---- flat, blocking ----
  // recv[i] = op over members of send[i], i < count.
  virtual void all_reduce(const void* send, void* recv, int64_t count, DType dtype,
                          ReduceOp op) = 0;
  // recv[r*count + i] = send_r[i]; recv holds size()*count elements.
  virtual void all_gather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // recv[i] = op over members of send[rank()*count + i]; send holds size()*count elements.
  virtual void reduce_scatter(const void* send, void* recv, int64_t count, DType dtype,
                              ReduceOp op) = 0;
  // buf on every member = buf of member `root`.
  virtual void broadcast(void* buf, int64_t count, DType dtype, int root) = 0;
  // recv on `root` = op over members of send; recv is unused elsewhere.
  virtual void reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                      int root) = 0;
  // recv[j*count + i] = send_j[rank()*count + i]; both hold size()*count elements; not in place.
  virtual void all_to_all(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // Point to point between members; messages between a pair with one tag arrive in order.
  virtual void send(const void* buf, int64_t count, DType dtype, int dst, int tag = 0) = 0;
  virtual void recv(void* buf, int64_t count, DType dtype, int src, int tag = 0) = 0;
  virtual void barrier() = 0;

  // ---- flat, non-blocking (buffers must stay alive until wait()) ----
  virtual Work iall_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op);
  virtual Work iall_gather(const void* send, void* recv, int64_t count, DType dtype);
  virtual Work ireduce_scatter(const void* send, void* recv, int64_t count, DType dtype,
                               ReduceOp op);
  virtual Work ibroadcast(void* buf, int64_t count, DType dtype, int root);
  virtual Work isend(const void* buf, int64_t count, DType dtype, int dst, int tag = 0);
  virtual Work irecv(void* buf, int64_t count, DType dtype, int src, int tag = 0);

  // ---- groups (collective over this communicator) ----
  // Members with the same color form a group, ordered by (key, rank()); color < 0 gets null.
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;
  // A group of the listed members (this communicator's numbering, in that order); every member
  // of this communicator must call it; non-listed ranks get null.
  std::shared_ptr<Communicator> new_group(const std::vector<int>& members);

  // ---- tensors (any dtype above, meta tensors are shape-only; strided inputs are copied) ----
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);  // in place
  void all_reduce(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum);
  // Concatenation of every member's tensor along `dim` (NxD gathers along the last dim and the
  // sequence dim).
  Tensor all_gather(const Tensor& t, int64_t dim = 0);
  // Reduces and keeps this member's chunk of `dim` (size(dim) % size() == 0, else ShapeError).
  Tensor reduce_scatter(const Tensor& t, int64_t dim = 0, ReduceOp op = ReduceOp::sum);
  void broadcast(const Tensor& t, int root);
  void reduce(const Tensor& t, int root, ReduceOp op = ReduceOp::sum);  // in place on root
  // Splits `split_dim` into size() chunks, sends chunk j to member j, concatenates the received
  // chunks along `concat_dim` (NxD's expert-parallel all-to-all).
  Tensor all_to_all(const Tensor& t, int64_t split_dim, int64_t concat_dim);
  void send(const Tensor& t, int dst, int tag = 0);
  void recv(const Tensor& t, int src, int tag = 0);
  // Non-blocking tensor forms (contiguous tensors, flat layout).
  Work iall_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
  Work iall_gather(const Tensor& in, const Tensor& out);  // out.numel() == size()*in.numel()
  Work ireduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum);
  Work isend(const Tensor& t, int dst, int tag = 0);
  Work irecv(const Tensor& t, int src, int tag = 0);

 protected:
  Communicator(int rank, std::vector<int> ranks) : rank_(rank), ranks_(std::move(ranks)) {}
  // Checks shared by the backends; throw InvalidArgument naming `op`: a count >= 0, and for a
  // reduction also a floating dtype for avg.
  void check_count(const char* op, int64_t count) const;
  void check_reduction(const char* op, int64_t count, const ReduceSpec& r) const;
  void check_member(const char* op, const char* what, int r) const;

 private:
  int rank_;
  std::vector<int> ranks_;
};

// A world of one rank: every collective is a copy (or nothing, in place); send/recv to self are
// buffered. The zero-copy path for single-rank runs.
std::shared_ptr<Communicator> make_self_communicator(int global_rank = 0);

// The current context's world communicator: the one installed by sim::launch / MPI, or a self
// communicator when the context has world size 1. Throws CommError if none is installed.
Communicator& world();
std::shared_ptr<Communicator> world_ptr();
void set_world(Context& ctx, std::shared_ptr<Communicator> comm);

}  // namespace nxd
