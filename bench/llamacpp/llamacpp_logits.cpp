// llamacpp-logits: the last position's logits of a fixed prompt under llama.cpp (libllama), raw
// f32, for bench/llamacpp/compare.py's agreement check against nxd before any timing.
//   llamacpp-logits MODEL.gguf IDS.txt OUT.f32 [--threads T]
// IDS.txt holds the prompt's token ids (whitespace separated); they are decoded as one batch at
// positions 0..n-1 (no BOS added). The KV cache is f32 (llama.cpp's default f16 cache would round
// K and V before attention, which the f32 check must not see) and flash attention is off (on the
// bench model, ggml's CPU flash attention alone moves the f32 logits by 4.5e-4 relative; without
// it llama.cpp and nxd differ by 1.2e-6). Built by compare.py against the
// llama.cpp build it uses, not by nxd's CMake (nxd does not depend on llama.cpp).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

int fail(const std::string& what) {
  std::fprintf(stderr, "llamacpp-logits: %s\n", what.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && !(argc == 6 && std::strcmp(argv[4], "--threads") == 0))
    return fail("usage: llamacpp-logits MODEL.gguf IDS.txt OUT.f32 [--threads T]");
  const int threads = argc == 6 ? std::atoi(argv[5]) : 1;
  if (threads < 1) return fail(std::string("--threads ") + argv[5] + ": expected >= 1");
  std::vector<llama_token> ids;
  {
    std::ifstream in(argv[2]);
    if (!in) return fail(std::string(argv[2]) + ": cannot open");
    long v = 0;
    while (in >> v) ids.push_back(static_cast<llama_token>(v));
  }
  if (ids.empty()) return fail(std::string(argv[2]) + ": no token ids");
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return fail(std::string(argv[1]) + ": llama.cpp could not load it");
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (llama_token t : ids)
    if (t < 0 || t >= n_vocab)
      return fail("token id " + std::to_string(t) + " outside the model's " +
                  std::to_string(n_vocab) + " ids");
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(ids.size()) + 16;
  cp.n_batch = static_cast<uint32_t>(ids.size());
  cp.n_ubatch = static_cast<uint32_t>(ids.size());
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return fail("llama_init_from_model failed");
  llama_batch batch = llama_batch_get_one(ids.data(), static_cast<int32_t>(ids.size()));
  if (llama_decode(ctx, batch) != 0) return fail("llama_decode failed");
  const float* logits = llama_get_logits_ith(ctx, -1);
  if (!logits) return fail("no logits for the last position");
  std::ofstream out(argv[3], std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits), static_cast<std::streamsize>(n_vocab) * 4);
  if (!out) return fail(std::string(argv[3]) + ": write failed");
  std::printf("llamacpp-logits: %zu tokens, %d logits -> %s\n", ids.size(), n_vocab, argv[3]);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
