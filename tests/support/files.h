#pragma once
// Files in the tests: a fresh scratch folder per test, a whole file as a string, and a CSV file
// as the tests read the metrics the trainer writes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace nxd::testing {

// The whole file (empty when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh, empty folder <temp>/<prefix><name of the running test>_<parent pid>. The parent's pid
// (ctest's, or mpirun's for every rank of one job) keeps two suites running at once from sharing
// folders while the ranks of one job still share theirs.
inline std::filesystem::path test_temp_dir(const std::string& prefix) {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() /
               (prefix + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                std::to_string(::getppid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A fresh scratch folder <temp>/<prefix><pid>_<test name>, removed when the test ends: the pid
// keeps runs of the same tests from other worktrees (sharing /tmp) apart.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& prefix)
      : path(test_temp_dir(prefix + std::to_string(::getpid()) + "_")) {}
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  operator const std::filesystem::path&() const { return path; }
};

// A small repetitive text a tiny model learns within a few dozen steps: `lines` lines written to
// dir/corpus.txt, whose path it returns.
inline std::filesystem::path tiny_corpus(const std::filesystem::path& dir, int lines = 300) {
  std::ofstream f(dir / "corpus.txt");
  for (int i = 0; i < lines; ++i) f << "the cat sat on the mat. " << (i % 7) << " dogs ran.\n";
  return dir / "corpus.txt";
}

// A CSV file: the header line and the rows split at commas (no quoting; an empty last column is
// kept).
struct Csv {
  std::string header;
  std::vector<std::vector<std::string>> rows;  // without the header
};

inline Csv read_csv(const std::filesystem::path& p) {
  Csv c;
  std::ifstream in(p);
  std::getline(in, c.header);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    std::stringstream ss(line);
    std::string col;
    while (std::getline(ss, col, ',')) cols.push_back(col);
    if (!line.empty() && line.back() == ',') cols.push_back("");
    c.rows.push_back(cols);
  }
  return c;
}

}  // namespace nxd::testing
