#include "nxd/train_app/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/runtime/error.h"

namespace fs = std::filesystem;

namespace nxd::train_app {

namespace {

constexpr const char* kLock = "nxd.lock";

std::string read_fd(int fd) {
  std::string s;
  char buf[512];
  if (lseek(fd, 0, SEEK_SET) < 0) return s;
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0 && s.size() < 4096;)
    s.append(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s.substr(0, 200);
}

// More than its header line.
bool has_rows(const fs::path& csv) {
  std::ifstream in(csv);
  std::string line;
  int lines = 0;
  while (lines < 2 && std::getline(in, line)) lines += !line.empty();
  return lines >= 2;
}

bool nonempty_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && !fs::is_empty(p, ec);
}

// path with its first free suffix: base.<k>ext or base/<k>
fs::path first_free(const fs::path& dir, const std::string& stem, const std::string& ext) {
  for (int k = 1;; ++k) {
    fs::path p = dir / (stem + std::to_string(k) + ext);
    std::error_code ec;
    if (!fs::exists(p, ec)) return p;
  }
}

void move(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec)
    throw IoError(
        str("[run_dir] cannot move ", from.string(), " to ", to.string(), ": ", ec.message()));
}

}  // namespace

std::string lock_owner_line() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  char when[32] = {0};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return str("pid ", getpid(), " host ", host, " started ", when);
}

RunDir::RunDir(const RunDirOptions& o) {
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec)
    throw IoError(
        str("[", o.program, "] cannot create output directory '", o.out_dir, "': ", ec.message()));
  lock(o);
  try {
    check_outputs(o);
  } catch (...) {
    unlink(lock_path_.c_str());
    close(fd_);
    fd_ = -1;
    throw;
  }
}

RunDir::~RunDir() {
  if (fd_ < 0) return;
  unlink(lock_path_.c_str());  // while still holding it: a waiter re-checks the inode
  close(fd_);
}

// flock() on <out>/nxd.lock. A file whose inode changed under us (its owner removed it as we
// opened it) is opened again, so two runs never both hold a lock.
void RunDir::lock(const RunDirOptions& o) {
  lock_path_ = (fs::path(o.out_dir) / kLock).string();
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      throw IoError(str("[", o.program, "] cannot create the lock file ", lock_path_, ": ",
                        std::strerror(errno)));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string owner = read_fd(fd);
      close(fd);
      if (err != EWOULDBLOCK)
        throw IoError(str("[", o.program, "] cannot lock ", lock_path_, ": ", std::strerror(err)));
      throw ConfigError(str("[", o.program, "] ", o.out_dir, " is in use by another run (",
                            owner.empty() ? "owner not recorded yet" : owner, ", per ", lock_path_,
                            "): wait for it to finish or choose another --out"));
    }
    struct stat a {
    }, b{};
    if (fstat(fd, &a) != 0 || stat(lock_path_.c_str(), &b) != 0 || a.st_ino != b.st_ino) {
      close(fd);
      continue;
    }
    const std::string stale = read_fd(fd);
    if (!stale.empty())
      notes_.push_back(
          str("took over the stale lock ", lock_path_, " (", stale, ": that run is gone)"));
    const std::string me = lock_owner_line() + "\n";
    if (ftruncate(fd, 0) != 0 ||
        pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
      throw IoError(str("[", o.program, "] cannot write ", lock_path_, ": ", std::strerror(errno)));
    fd_ = fd;
    return;
  }
  throw IoError(str("[", o.program, "] could not lock ", lock_path_, " (it keeps being replaced)"));
}

void RunDir::check_outputs(const RunDirOptions& o) {
  const fs::path out = o.out_dir;
  std::error_code ec;
  std::vector<std::string> found;
  // a metrics.csv with no row (a run that failed before its first step) holds no work
  if (has_rows(out / "metrics.csv")) found.push_back("metrics.csv");
  if (fs::exists(out / "sample.txt", ec)) found.push_back("sample.txt");
  std::string tags;
  for (const auto& t : ckpt::list_checkpoints(o.checkpoint_dir))
    tags += (tags.empty() ? "" : ", ") + t.tag + (t.complete ? "" : " (incomplete)");
  if (nonempty_dir(o.checkpoint_dir))
    found.push_back("checkpoints/" + (tags.empty() ? std::string() : " (" + tags + ")"));
  if (found.empty()) return;
  bool resume_here = o.resume_if_exists;
  if (!o.resume_from.empty()) {
    const fs::path a = fs::weakly_canonical(o.resume_from, ec);
    const fs::path c = fs::weakly_canonical(o.checkpoint_dir, ec);
    const std::string as = a.string(), cs = c.string();
    resume_here =
        resume_here || (as.rfind(cs, 0) == 0 && (as.size() == cs.size() || as[cs.size()] == '/'));
  }
  if (resume_here) {  // the same run going on: its earlier metrics stay, numbered
    if (fs::exists(out / "metrics.csv", ec)) {
      const fs::path to = first_free(out, "metrics.", ".csv");
      move(out / "metrics.csv", to);
      notes_.push_back(str("kept the earlier metrics.csv as ", to.filename().string()));
    }
    return;
  }
  std::string list;
  for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
  if (o.existing_run != "set_aside")
    throw ConfigError(str("[", o.program, "] ", o.out_dir, " holds another run's outputs (", list,
                          "): resume it (exp_manager.resume_if_exists=true), choose another "
                          "--out, or set exp_manager.existing_run=set_aside to move them to ",
                          (out / "previous_runs").string(), "/ first"));
  fs::create_directories(out / "previous_runs", ec);
  const fs::path to = first_free(out / "previous_runs", "", "");
  fs::create_directories(to, ec);
  if (ec) throw IoError(str("[", o.program, "] cannot create ", to.string(), ": ", ec.message()));
  for (const char* name : {"metrics.csv", "sample.txt", "tensorboard", "config.yaml"})
    if (fs::exists(out / name, ec)) move(out / name, to / name);
  if (fs::exists(o.checkpoint_dir, ec))
    move(o.checkpoint_dir, to / fs::path(o.checkpoint_dir).filename());
  notes_.push_back(str("moved the earlier run's outputs (", list, ") to ", to.string()));
}

}  // namespace nxd::train_app
