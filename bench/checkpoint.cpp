// nxd-bench-checkpoint: save and load GB/s of a model of --mb MiB of f32 parameters (plain,
// zstd, async) against a raw write (+ fsync) and read of the same bytes in the same run, the
// compressed size ratio, the async save's stall against a memcpy of the same bytes, and CRC-32C
// against memcpy. Each repetition runs every case once, in rotating order; medians are printed.
// Reads come from the page cache (the files were just written), for nxd and the baseline alike.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "bench_util.h"
#include "nxd/checkpoint/checkpoint.h"
#include "nxd/io/crc32c.h"
#include "nxd/runtime/init.h"

using namespace nxd;
namespace fs = std::filesystem;

namespace {

// Parameters only: 16 MiB f32 tensors of normal(0, 0.02) values (what trained weights look like
// to a compressor: little redundancy).
class Blob : public Module {
 public:
  explicit Blob(int64_t mb) : Module("Blob") {
    const int64_t per = 4 << 20;  // floats per tensor
    for (int64_t i = 0; i < mb / 16; ++i) {
      Tensor t = empty({per}, DType::f32);
      init::normal(t, RngStream{7, static_cast<uint64_t>(i)}, 0.0, 0.02);
      std::string name = "w";
      name += std::to_string(i);
      register_parameter(name, t);
    }
  }
};

int64_t dir_bytes(const fs::path& p) {
  int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(p))
    if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
  return n;
}

void raw_write(const Module& m, const fs::path& file, bool sync) {
  const std::string tmp = file.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  NXD_CHECK_T(IoError, fd >= 0, "cannot create ", tmp);
  for (const auto& [n, t] : m.named_parameters()) {
    const char* p = static_cast<const char*>(t.raw_data());
    for (int64_t left = t.nbytes(); left > 0;) {
      const ssize_t w = ::write(fd, p, static_cast<size_t>(left));
      NXD_CHECK_T(IoError, w > 0, "write failed");
      p += w;
      left -= w;
    }
  }
  if (sync) ::fsync(fd);
  ::close(fd);
  fs::rename(tmp, file);
}

void raw_read(const fs::path& file, std::vector<char>& buf) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  NXD_CHECK_T(IoError, fd >= 0, "cannot open ", file.string());
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t r = ::read(fd, buf.data() + got, buf.size() - got);
    NXD_CHECK_T(IoError, r > 0, "read failed");
    got += static_cast<size_t>(r);
  }
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args(argc, argv, "saving and loading a sharded checkpoint against raw write/read",
                   {{"--mb", "MiB", "model size (>= 16)"},
                    {"--reps", "N", "repetitions"},
                    {"--dir", "PATH", "scratch folder (removed and recreated)"},
                    {"--nosync", "", "do not fsync"}});
  const int64_t mb = args.get_int("--mb", 1024);
  const int reps = static_cast<int>(args.get_int("--reps", 3));
  const bool sync = !args.has("--nosync");
  const fs::path dir =
      args.get_str("--dir", (fs::temp_directory_path() / "nxd_bench_ckpt").string());
  if (mb < 16 || reps < 1) {
    std::fprintf(stderr,
                 "usage: nxd-bench-checkpoint [--mb MiB>=16] [--reps N] [--dir PATH] [--nosync]\n");
    return 2;
  }
  fs::remove_all(dir);
  fs::create_directories(dir);
  Blob model(mb);
  const double bytes = static_cast<double>(mb / 16 * 16) * (1 << 20);
  const double gb = bytes / 1e9;
  std::vector<char> buf(static_cast<size_t>(bytes));
  std::map<std::string, std::vector<double>> t;
  std::vector<double> stall;
  ckpt::SaveOptions plain{.sync = sync}, zstd{.compress = true, .sync = sync},
      async{.async_save = true, .sync = sync};
  using Case = std::pair<std::string, std::function<void()>>;
  std::vector<Case> cases = {
      {"raw_write", [&] { raw_write(model, dir / "raw.bin", sync); }},
      {"save_plain",
       [&] { ckpt::save_checkpoint(dir, "plain", &model, nullptr, nullptr, nullptr, plain); }},
      {"save_zstd",
       [&] { ckpt::save_checkpoint(dir, "zstd", &model, nullptr, nullptr, nullptr, zstd); }},
      {"save_async_total",
       [&] {
         stall.push_back(
             ckpt::save_checkpoint(dir, "async", &model, nullptr, nullptr, nullptr, async)
                 .stall_seconds);
         ckpt::finalize_checkpoint();
       }},
      {"memcpy",
       [&] {
         size_t off = 0;
         for (const auto& [n, p] : model.named_parameters()) {
           std::memcpy(buf.data() + off, p.raw_data(), static_cast<size_t>(p.nbytes()));
           off += static_cast<size_t>(p.nbytes());
         }
       }},
      {"crc32c",
       [&] {
         uint32_t c = 0;
         for (const auto& [n, p] : model.named_parameters())
           c ^= io::crc32c(p.raw_data(), static_cast<size_t>(p.nbytes()));
         if (c == 0x12345678u) std::printf(" ");
       }},
  };
  std::vector<Case> loads = {
      {"raw_read", [&] { raw_read(dir / "raw.bin", buf); }},
      {"load_plain",
       [&] { ckpt::load_checkpoint(dir, &model, nullptr, nullptr, {.tag = "plain"}); }},
      {"load_zstd", [&] { ckpt::load_checkpoint(dir, &model, nullptr, nullptr, {.tag = "zstd"}); }},
  };
  for (int r = 0; r < reps; ++r) {
    for (auto* set : {&cases, &loads})
      for (size_t k = 0; k < set->size(); ++k) {
        const auto& [name, f] = (*set)[(k + r) % set->size()];
        const double t0 = bench::now_seconds();
        f();
        t[name].push_back(bench::now_seconds() - t0);
      }
  }
  auto med = [&](const std::string& n) { return bench::median_of(t[n]); };
  auto spread = [&](const std::string& n) {
    const auto& v = t[n];
    char buf[64];
    std::snprintf(buf, sizeof buf, "min=%.3f max=%.3f", *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    return std::string(buf);
  };
  std::printf(
      "# nxd-bench-checkpoint: %.2f GB of f32 in %lld tensors, %d reps (median), fsync=%s, "
      "dir=%s\n",
      gb, static_cast<long long>(mb / 16), reps, sync ? "on" : "off", dir.c_str());
  for (const char* n : {"raw_write", "save_plain", "save_zstd", "save_async_total"})
    std::printf("case=%s seconds=%.3f GBps=%.2f ratio_to_raw_write=%.2f %s\n", n, med(n),
                gb / med(n), med("raw_write") / med(n), spread(n).c_str());
  for (const char* n : {"raw_read", "load_plain", "load_zstd"})
    std::printf("case=%s seconds=%.3f GBps=%.2f ratio_to_raw_read=%.2f %s\n", n, med(n),
                gb / med(n), med("raw_read") / med(n), spread(n).c_str());
  const double st = bench::median_of(stall);
  std::printf(
      "case=async_stall seconds=%.3f GBps=%.2f memcpy_seconds=%.3f stall_vs_sync_save=%.3f\n", st,
      gb / st, med("memcpy"), st / med("save_plain"));
  std::printf("case=crc32c GBps=%.2f memcpy_GBps=%.2f\n", gb / med("crc32c"), gb / med("memcpy"));
  std::printf("case=zstd_size ratio=%.3f plain_bytes=%lld zstd_bytes=%lld\n",
              static_cast<double>(dir_bytes(dir / "zstd")) / dir_bytes(dir / "plain"),
              static_cast<long long>(dir_bytes(dir / "plain")),
              static_cast<long long>(dir_bytes(dir / "zstd")));
  fs::remove_all(dir);
  return 0;
}
