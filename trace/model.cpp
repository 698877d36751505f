#include "nxd/trace/model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>

#include "nxd/collectives/communicator.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/runtime/context.h"

namespace nxd::trace {

BucketConfig BucketConfig::automatic(const AutomaticBuckets& o) {
  const int64_t batch = o.batch, min_seq = o.min_seq, max_seq = o.max_seq;
  NXD_CHECK(batch > 0 && min_seq > 0 && max_seq >= min_seq,
            "[BucketConfig::automatic] need 0 < min_seq <= max_seq and batch > 0, got batch=",
            batch, " min_seq=", min_seq, " max_seq=", max_seq);
  BucketConfig c;
  int64_t s = 1;
  while (s < min_seq) s *= 2;
  for (; s < max_seq; s *= 2) c.buckets.push_back({batch, s});
  c.buckets.push_back({batch, max_seq});
  return c;
}

BucketConfig BucketConfig::explicit_shapes(std::vector<Bucket> shapes) {
  for (const Bucket& b : shapes)
    NXD_CHECK(b.batch > 0 && b.seq > 0, "[BucketConfig] bucket sizes must be positive, got (",
              b.batch, ", ", b.seq, ")");
  return BucketConfig{std::move(shapes)};
}

namespace {
bool follows(const Shape& s, int64_t B, int64_t S, int d) {
  return static_cast<int>(s.size()) > d && s[d] == (d == 0 ? B : S);
}
}  // namespace

std::vector<Tensor> bucket_inputs(const std::vector<Tensor>& examples, const Bucket& b) {
  NXD_CHECK(!examples.empty() && examples[0].dim() >= 2,
            "[parallel_model_trace] example input 0 must be [batch, seq, ...], got ",
            examples.empty() ? std::string("none") : examples[0].desc());
  const int64_t B = examples[0].size(0), S = examples[0].size(1);
  std::vector<Tensor> out;
  for (const Tensor& x : examples) {
    Shape s = x.shape();
    const bool b0 = follows(s, B, S, 0), s1 = b0 && follows(s, B, S, 1);
    if (b0) s[0] = b.batch;
    if (s1) s[1] = b.seq;
    out.push_back(zeros(s, x.dtype(), x.device()));
  }
  return out;
}

int compile_rank_graphs(std::vector<std::vector<Graph>>& per_rank, std::vector<RankProgram>& ranks,
                        const CompileOptions& opts, int parallel) {
  std::map<std::string, std::shared_ptr<const CompiledGraph>> distinct;
  std::vector<std::pair<std::string, const Graph*>> todo;
  std::vector<std::vector<std::string>> keys(per_rank.size());
  for (size_t r = 0; r < per_rank.size(); ++r)
    for (const Graph& g : per_rank[r]) {
      std::string k = graph_to_json(g);
      if (!distinct.count(k)) {
        distinct[k] = nullptr;
        todo.emplace_back(k, &g);
      }
      keys[r].push_back(std::move(k));
    }
  const size_t workers = std::max<size_t>(1, std::min<size_t>(todo.size(), std::max(parallel, 1)));
  std::vector<std::shared_ptr<const CompiledGraph>> done(todo.size());
  std::vector<std::future<void>> fut;
  for (size_t w = 0; w < workers; ++w)
    fut.push_back(std::async(std::launch::async, [&, w] {
      for (size_t i = w; i < todo.size(); i += workers)
        done[i] = std::make_shared<const CompiledGraph>(compile(*todo[i].second, opts));
    }));
  for (auto& f : fut) f.get();
  for (size_t i = 0; i < todo.size(); ++i) distinct[todo[i].first] = done[i];
  for (size_t r = 0; r < per_rank.size(); ++r) {
    ranks[r].graphs.clear();
    for (const std::string& k : keys[r]) ranks[r].graphs.push_back(distinct[k]);
    ranks[r].replay.assign(ranks[r].graphs.size(), ReplayState{});
  }
  return static_cast<int>(todo.size());
}

namespace {

void write_workdir(const std::string& dir, int rank, const RankProgram& p) {
  if (dir.empty()) return;
  const std::filesystem::path d = std::filesystem::path(dir) / str("rank", rank);
  std::filesystem::create_directories(d);
  for (size_t b = 0; b < p.graphs.size(); ++b) {
    std::ofstream f(d / str("bucket", b, ".txt"));
    f << plan_dump(*p.graphs[b]);
    NXD_CHECK(f.good(), "[parallel_model_trace] cannot write ",
              (d / str("bucket", b, ".txt")).string());
  }
}

// Builds and traces this rank's shard for every bucket.
void trace_rank(const ModelFn& model_fn, const std::vector<Tensor>& examples,
                const std::vector<Bucket>& buckets, const TraceOptions& opts, RankProgram& p,
                std::vector<Graph>& graphs) {
  RankModel m = model_fn();
  NXD_CHECK(m.forward, "[parallel_model_trace] model_fn returned no forward");
  p.weights = m.params;
  p.state = m.state;
  p.owner = m.owner;
  for (const Bucket& b : buckets) {
    std::vector<Tensor> args =
        opts.bucket_example ? opts.bucket_example(b) : bucket_inputs(examples, b);
    TraceResult t = trace_graph(m.forward, TraceInputs{m.params, std::move(args), m.state});
    std::vector<Tensor> ps;
    for (const auto& kv : m.params) ps.push_back(kv.second);
    p.params.push_back(std::move(ps));
    p.constants.push_back(std::move(t.constants));
    graphs.push_back(std::move(t.graph));
  }
}

}  // namespace

std::shared_ptr<TensorParallelModel> parallel_model_trace(const ModelFn& model_fn,
                                                          const std::vector<Tensor>& example_inputs,
                                                          const TraceOptions& opts) {
  const int tp = opts.tp_degree;
  NXD_CHECK(tp >= 1, "[parallel_model_trace] tp_degree must be >= 1, got ", tp);
  NXD_CHECK(opts.backend == "sim" || opts.backend == "mpi",
            "[parallel_model_trace] backend must be sim or mpi, got '", opts.backend, "'");
  const CompileOptions co = parse_compiler_args(opts.args);
  std::vector<Bucket> buckets = opts.bucket_config.buckets;
  if (buckets.empty()) {
    NXD_CHECK(!example_inputs.empty() && example_inputs[0].dim() >= 2,
              "[parallel_model_trace] example input 0 must be [batch, seq, ...]");
    buckets.push_back({example_inputs[0].size(0), example_inputs[0].size(1)});
  }
  const bool local = opts.backend == "mpi" || tp == 1;
  const int nranks = local ? 1 : tp;
  std::vector<RankProgram> ranks(nranks);
  std::vector<std::vector<Graph>> graphs(nranks);
  if (local) {
    if (opts.backend == "mpi") {
      NXD_CHECK(world().size() == tp, "[parallel_model_trace] tp_degree=", tp,
                " but the MPI world has ", world().size(), " processes");
      if (!parallel_state::model_parallel_is_initialized())
        parallel_state::initialize_model_parallel(tp);
    }
    trace_rank(model_fn, example_inputs, buckets, opts, ranks[0], graphs[0]);
  } else {
    sim::LaunchOptions lo;
    lo.world_size = tp;
    sim::launch(lo, [&] {
      parallel_state::initialize_model_parallel(tp);
      const int r = current_context().rank();
      trace_rank(model_fn, example_inputs, buckets, opts, ranks[r], graphs[r]);
    });
  }
  const int distinct = compile_rank_graphs(graphs, ranks, co, opts.max_parallel_compilations);
  const int rank0 = opts.backend == "mpi" ? world().rank() : 0;
  for (int r = 0; r < nranks; ++r) write_workdir(opts.workdir, rank0 + r, ranks[r]);
  auto m = std::make_shared<TensorParallelModel>(opts, buckets, std::move(ranks), example_inputs);
  m->set_distinct_compilations(distinct);
  return m;
}

}  // namespace nxd::trace
