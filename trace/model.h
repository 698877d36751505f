#pragma once
// parallel_model_trace / TensorParallelModel: NxD's "Model Trace" in C++ (docs/design/trace.md,
// "Traced models"; departures from NxD are listed there).
//
// model_fn runs on every TP rank (sim ranks as threads, or the processes of an mpirun) with
// parallel_state initialized to TP = tp_degree, and returns that rank's shard (RankModel). Each
// rank traces its shard once per bucket; identical rank graphs are compiled once. The result
// runs all ranks on every call and returns rank 0's outputs (NxD's semantics).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nxd/trace/compile.h"
#include "nxd/trace/tracer.h"

namespace nxd::trace {

// What model_fn builds on a rank: its parameters (one copy shared by every bucket), its forward
// and its state tensors (updated in place), and the object that owns them.
struct RankModel {
  NamedTensors params;
  ForwardFn forward;
  NamedTensors state;
  std::shared_ptr<void> owner;
};
using ModelFn = std::function<RankModel()>;

struct Bucket {
  int64_t batch = 1, seq = 1;
};
// The input shapes graphs are traced for. A call goes to the smallest bucket (fewest tokens,
// then shortest) whose batch and sequence both fit; its inputs are padded (ids with 0, at the
// end: a causal model's real positions do not see them) and the outputs cut back.
struct AutomaticBuckets {
  int64_t batch = 1;
  int64_t min_seq = 1;
  int64_t max_seq = 0;  // required: >= min_seq
};
struct BucketConfig {
  std::vector<Bucket> buckets;  // empty: one bucket, the example inputs' shape
  // Sequence lengths at powers of two from min_seq up to max_seq (max_seq itself last if not a
  // power of two), each at `batch` rows: automatic({.min_seq = 100, .max_seq = 1000}) gives
  // 128, 256, 512, 1000.
  static BucketConfig automatic(const AutomaticBuckets& o);
  static BucketConfig explicit_shapes(std::vector<Bucket> shapes);
};

struct TraceOptions {
  int tp_degree = 1;
  BucketConfig bucket_config;
  bool inline_weights = false;  // save: weights inside each graph's file, not shared
  std::string workdir;          // compiler_workdir: a dump of every graph and its plan
  std::string args;             // compiler_args (compile.h)
  int max_parallel_compilations = 1;
  // "sim": ranks as threads of this process; "mpi": this process is one rank of an mpirun whose
  // world has tp_degree processes.
  std::string backend = "sim";
  // The example inputs of a bucket, when zeros of the bucketed shapes would not do (e.g. a
  // decoder's cache positions and lengths); default bucket_inputs().
  std::function<std::vector<Tensor>(const Bucket&)> bucket_example;
  // false: a call only fits buckets of its own batch size (rows cannot be padded, e.g. the cache
  // rows of a decoder); true: batch rows are padded too.
  bool pad_batch = true;
};

struct BucketStats {
  int64_t calls = 0;
  int64_t real_tokens = 0;    // batch x sequence of the calls' inputs
  int64_t padded_tokens = 0;  // tokens added to reach the bucket
};

// One rank's traced model: weights, state, constants and a compiled graph per bucket.
struct RankProgram {
  NamedTensors weights;  // by name, shared by the buckets
  NamedTensors state;
  std::vector<std::shared_ptr<const CompiledGraph>> graphs;  // per bucket
  std::vector<std::vector<Tensor>> params, constants;        // per bucket, in graph order
  std::vector<ReplayState> replay;                           // per bucket (arenas)
  std::shared_ptr<void> owner;
};

class TensorParallelModel {
 public:
  TensorParallelModel(TraceOptions opts, std::vector<Bucket> buckets,
                      std::vector<RankProgram> ranks, std::vector<Tensor> example_inputs);
  // Routes, pads, runs every rank and returns rank 0's outputs, cut back to the input's batch
  // and sequence. An input larger than every bucket is a ShapeError naming both.
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs);
  // The bucket a [batch, seq] input goes to (ShapeError when none fits).
  size_t route(int64_t batch, int64_t seq) const;

  int tp_degree() const { return opts_.tp_degree; }
  const TraceOptions& options() const { return opts_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<BucketStats>& stats() const { return stats_; }
  const std::vector<RankProgram>& ranks() const { return ranks_; }  // all ranks (sim) or this one
  std::vector<RankProgram>& ranks() { return ranks_; }
  const std::vector<Tensor>& example_inputs() const { return examples_; }
  // Free-form strings saved in the manifest and restored by load (e.g. the model's config).
  std::map<std::string, std::string>& metadata() { return metadata_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  int distinct_compilations() const { return distinct_; }
  void set_distinct_compilations(int n) { distinct_ = n; }
  // Bytes of weights, state and constants held (each storage counted once) and of every graph's
  // arena (allocated on the graph's first call).
  int64_t resident_bytes() const;

 private:
  std::vector<Tensor> run_rank(size_t r, size_t bucket, const std::vector<Tensor>& args);
  TraceOptions opts_;
  std::vector<Bucket> buckets_;
  std::vector<RankProgram> ranks_;
  std::vector<Tensor> examples_;
  std::vector<BucketStats> stats_;
  int distinct_ = 0;
  std::map<std::string, std::string> metadata_;
};

// Traces model_fn on every rank for every bucket (example_inputs give the arguments' dtypes and
// trailing dims; input 0 is [batch, seq] and every input with the same leading dims follows its
// bucket), compiles and returns the model. Writes opts.workdir/rank<r>/bucket<b>.txt when set.
std::shared_ptr<TensorParallelModel> parallel_model_trace(const ModelFn& model_fn,
                                                          const std::vector<Tensor>& example_inputs,
                                                          const TraceOptions& opts);

// The example inputs of a bucket: input 0's and its followers' leading dims set to the bucket's.
std::vector<Tensor> bucket_inputs(const std::vector<Tensor>& examples, const Bucket& b);

// Compiles each distinct graph once (equal JSON text), with up to `parallel` threads; fills
// every rank's graphs. Returns the number of distinct graphs.
int compile_rank_graphs(std::vector<std::vector<Graph>>& per_rank, std::vector<RankProgram>& ranks,
                        const CompileOptions& opts, int parallel);

}  // namespace nxd::trace
