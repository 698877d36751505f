#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nxd/runtime/error.h"
#include "nxd/trainer/log.h"

using namespace nxd::trainer;

TEST(Metrics, RowFormat) {
  MetricsRow r;
  r.step = 10;
  r.loss = 2.123456789123;
  r.lr = 1e-3;
  r.grad_norm = 0.5;
  r.tokens_per_s = 12345.67;
  r.epoch = 1;
  r.elapsed_s = 3.25;
  EXPECT_EQ(MetricsWriter::header(),
            "step,loss,val_loss,lr,grad_norm,tokens_per_s,epoch,elapsed_s,sim_step_s");
  EXPECT_EQ(MetricsWriter::format(r), "10,2.12345679,,0.001,0.5,12345.7,1,3.250,");
  r.val_loss = 1.0f / 3.0f;
  EXPECT_EQ(MetricsWriter::format(r), "10,2.12345679,0.333333343,0.001,0.5,12345.7,1,3.250,");
  r.sim_step_s = 0.0125;
  EXPECT_EQ(MetricsWriter::format(r), "10,2.12345679,0.333333343,0.001,0.5,12345.7,1,3.250,0.0125");
  // 9 significant digits round-trip every float
  for (float f : {5.5451774f, 1.0f / 3.0f, 2.7182817f, 1e-7f}) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", f);
    EXPECT_EQ(std::stof(buf), f) << buf;
  }
}

TEST(Metrics, WritesFile) {
  auto p = std::filesystem::temp_directory_path() / "nxd_log_test_metrics.csv";
  {
    MetricsWriter w(p.string());
    MetricsRow r;
    r.step = 1;
    r.loss = 5.5;
    w.write(r);
  }
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), MetricsWriter::header() + "\n1,5.5,,0,0,0.0,0,0.000,\n");
  EXPECT_THROW(MetricsWriter("/nonexistent_dir_nxd/m.csv"), nxd::IoError);
}

TEST(Progress, PlainLinesWhenNotATerminal) {
  char buf[4096] = {};
  std::FILE* f = fmemopen(buf, sizeof buf, "w");
  ProgressBar bar(100, false, f);
  MetricsRow r;
  r.step = 50;
  r.loss = 2.5;
  r.lr = 1e-3;
  r.tokens_per_s = 20000;
  r.elapsed_s = 30;
  bar.update(r);
  bar.message("hello");
  bar.finish();
  std::fclose(f);
  std::string out(buf);
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_NE(out.find("step 50/100 loss 2.5000"), std::string::npos) << out;
  EXPECT_NE(out.find("20.0k tok/s"), std::string::npos) << out;
  EXPECT_NE(out.find("ETA 0:30"), std::string::npos) << out;
  EXPECT_NE(out.find("\nhello\n"), std::string::npos) << out;
}

TEST(Progress, RedrawsInPlaceOnATerminal) {
  char buf[4096] = {};
  std::FILE* f = fmemopen(buf, sizeof buf, "w");
  ProgressBar bar(10, true, f);
  MetricsRow r;
  r.step = 5;
  r.loss = 1;
  r.elapsed_s = 5;
  bar.update(r);
  r.step = 10;
  bar.update(r);
  bar.finish();
  std::fclose(f);
  std::string out(buf);
  EXPECT_NE(out.find("\r\033[K[############............] 5/10"), std::string::npos) << out;
  EXPECT_NE(out.find("\r\033[K[########################] 10/10"), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n');
}

TEST(Progress, Durations) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(65), "1:05");
  EXPECT_EQ(format_duration(3723), "1:02:03");
}
