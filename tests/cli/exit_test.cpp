// cli::run_main: each kind of escaping exception gets its exit code and one line on stderr naming
// the program; a non-zero launcher rank stays silent on mistakes every rank finds alike.
#include "nxd/cli/exit.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include "nxd/runtime/error.h"

namespace {

struct Outcome {
  int code;
  std::string err;
};

template <class E>
Outcome run_throwing(E e, nxd::cli::ExitOptions o = {}) {
  ::testing::internal::CaptureStderr();
  const int code = nxd::cli::run_main(
      "tool", [&]() -> int { throw e; }, o);
  return {code, ::testing::internal::GetCapturedStderr()};
}

TEST(CliExit, BodysCodeWhenNothingEscapes) {
  EXPECT_EQ(nxd::cli::run_main("tool", [] { return 3; }), 3);
}

TEST(CliExit, EachKindGetsItsCodeAndOneLine) {
  Outcome u = run_throwing(nxd::ConfigError("[cfg] x=7 is\nnot allowed"));
  EXPECT_EQ(u.code, 2);
  EXPECT_EQ(u.err, "tool: error: [cfg] x=7 is not allowed\n");
  Outcome f = run_throwing(
      std::filesystem::filesystem_error("cannot create", std::filesystem::path("/proc/x"),
                                        std::make_error_code(std::errc::io_error)));
  EXPECT_EQ(f.code, 2);
  EXPECT_EQ(f.err.rfind("tool: error: ", 0), 0u) << f.err;
  EXPECT_NE(f.err.find("/proc/x"), std::string::npos) << f.err;
  Outcome m = run_throwing(nxd::OutOfDeviceMemory("[hbm] 20 GiB over 16 GiB"));
  EXPECT_EQ(m.code, 2);
  EXPECT_EQ(m.err, "tool: error: [hbm] 20 GiB over 16 GiB\n");
  Outcome c = run_throwing(nxd::CommError("[sim] rank 3 did not arrive"));
  EXPECT_EQ(c.code, 1);
  EXPECT_EQ(c.err, "tool: error: [sim] rank 3 did not arrive\n");
  Outcome i = run_throwing(std::logic_error("unexpected"));
  EXPECT_EQ(i.code, 1);
  EXPECT_EQ(i.err, "tool: internal error: unexpected\n");
}

TEST(CliExit, OtherLauncherRanksAreQuietOnSharedMistakes) {
  const nxd::cli::ExitOptions quiet{.quiet = true};
  Outcome u = run_throwing(nxd::ConfigError("[cfg] bad"), quiet);
  EXPECT_EQ(u.code, 0);
  EXPECT_EQ(u.err, "");
  Outcome i = run_throwing(std::logic_error("unexpected"), quiet);
  EXPECT_EQ(i.code, 1);
  EXPECT_EQ(i.err, "");
  // a rank's own failures are printed by that rank
  Outcome c = run_throwing(nxd::CommError("[sim] rank 3 did not arrive"), quiet);
  EXPECT_EQ(c.code, 1);
  EXPECT_NE(c.err.find("rank 3"), std::string::npos);
}

TEST(CliExit, LauncherRankFromTheEnvironment) {
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("PMI_RANK");
  ::unsetenv("PMIX_RANK");
  EXPECT_EQ(nxd::cli::launcher_rank(), 0);
  ::setenv("PMI_RANK", "5", 1);
  EXPECT_EQ(nxd::cli::launcher_rank(), 5);
  ::unsetenv("PMI_RANK");
}

}  // namespace
