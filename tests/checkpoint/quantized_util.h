#pragma once
// What the quantized-checkpoint tests share: a model loaded from a checkpoint (quantized, or
// quantized at load) with its quantized tensors and logits, rewriting a file with an edit, and
// expecting its load refused naming the file and a key.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nxd/checkpoint/error.h"
#include "nxd/checkpoint/model_source.h"
#include "nxd/checkpoint/quantized.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/io/safetensors.h"
#include "nxd/layers/models/quantize_lm.h"
#include "support/tiny_models.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;

// The text whose logits load() returns.
inline const std::vector<int64_t>& quantized_test_text() {
  static const std::vector<int64_t> t = nxd::testing::id_sequence(24, 256, 5);
  return t;
}

struct Loaded {
  std::vector<std::vector<uint8_t>> bytes;  // per rank: every quantized tensor, in order
  std::vector<std::string> names;           // rank 0's quantized tensors
  std::vector<float> logits;                // rank 0's on quantized_test_text()
  bool head_weight_meta = false;            // the head's f32/bf16 weight was freed
  QuantizeSummary head;
};

// The model of `src` at TP tp, quantized at load with `at_load` when set.
inline Loaded load(const std::string& src, int tp, const QuantizeOptions* at_load) {
  ModelSource s = resolve_model_source({.tool = "test", .checkpoint = src, .tp = tp});
  Loaded r;
  r.bytes.resize(static_cast<size_t>(tp));
  sim::launch(tp, [&] {
    parallel_state::initialize_model_parallel(tp);
    auto m = build_model(s);
    QuantizeSummary head;
    if (at_load) head = quantize_causal_lm(*m, {}, *at_load).head;
    const int rank = parallel_state::get_tensor_model_parallel_rank();
    std::vector<uint8_t>& b = r.bytes[static_cast<size_t>(rank)];
    std::vector<std::string> names;
    for (auto& [name, t] : quantized_tensors(*m)) {
      const auto* p = static_cast<const uint8_t*>(t.raw_data());
      b.insert(b.end(), p, p + t.nbytes());
      names.push_back(name);
    }
    NoGradGuard g;
    const Tensor lg =
        m->forward(from_vector(quantized_test_text(), {1, 24})).to(DType::f32).contiguous();
    if (rank == 0) {
      r.logits.assign(lg.data<float>(), lg.data<float>() + lg.numel());
      r.names = names;
      r.head_weight_meta = m->output_head_weight().is_meta();
      r.head = head;
    }
  });
  return r;
}

// Rewrites OUT/quantized.safetensors with `edit` applied to its tensors and metadata.
inline void rewrite(const fs::path& out,
                    const std::function<void(std::vector<std::pair<std::string, Tensor>>&,
                                             std::map<std::string, std::string>&)>& edit) {
  io::SafetensorsReader r(out / kQuantizedFile);
  std::map<std::string, std::string> md = r.header().metadata;
  auto t = r.read_all();
  edit(t, md);
  io::write_safetensors(out / kQuantizedFile, t, md);
}

inline void expect_refused(const fs::path& out, const std::string& key, const std::string& what) {
  try {
    verify_quantized_checkpoint(out);
    ADD_FAILURE() << "accepted a file with " << what;
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find((out / kQuantizedFile).string()), std::string::npos) << m;
    EXPECT_NE(m.find(key), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  }
}

}  // namespace nxd::ckpt
