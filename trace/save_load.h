#pragma once
// parallel_model_save / parallel_model_load: a traced model as a folder (format version 2,
// documented in docs/design/trace.md, "Traced models: the file format"):
//   manifest.json                 format, version, TP degree, buckets, example inputs, compiler
//                                 args, metadata (nxd-generate's model_config), every other file
//                                 with its size and CRC-32C, and "checksum": the CRC-32C of the
//                                 manifest itself without that key (manifest_checksum)
//   rank<r>/bucket<b>.json        the compiled graph of rank r for bucket b and its memory plan,
//                                 with "rank" and "bucket"
//   rank<r>/weights.safetensors   rank r's weights (unless inlined) and state tensors; its header
//                                 records nxd.trace_rank
//   rank<r>/bucket<b>.safetensors the graph's constants, and its own copy of the weights when
//                                 inline_weights was set; records nxd.trace_rank, nxd.trace_bucket
// Loading maps the files (mmap), checks the manifest's checksum, every size and checksum in the
// manifest and that every file records the rank (and bucket) its name says, parses and recompiles
// every graph (its plan must equal the saved one) before anything runs: a truncated, corrupt,
// edited, swapped, missing or unknown-version file is a TraceError naming it. Version 1 traces
// (without the checksum and ranks) are refused, saying to trace again.
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "nxd/trace/model.h"

namespace nxd::trace {

inline constexpr int kTraceFormatVersion = 2;

// The CRC-32C (8 hex digits) of a manifest's JSON (dump(1)) without its "checksum" key.
std::string manifest_checksum(const nlohmann::json& manifest);

// Writes the model into `dir`, which must not exist or be empty (nothing is overwritten). On
// sim every rank's files; under mpirun each process writes its rank and rank 0 the manifest (a
// shared folder).
void parallel_model_save(const TensorParallelModel& model, const std::filesystem::path& dir);

struct LoadOptions {
  std::string backend = "sim";  // "mpi": this process loads its rank of an mpirun
  int expect_tp_degree = 0;     // > 0: refuse a model traced at another TP degree
};
std::shared_ptr<TensorParallelModel> parallel_model_load(const std::filesystem::path& dir,
                                                         const LoadOptions& opts = {});

}  // namespace nxd::trace
