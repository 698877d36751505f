// nxd-plot: the PNG encoder (known-answer checksums; files decode back to the same pixels with
// every chunk CRC and the Adler-32 valid), the chart (ticks, every series drawn), and the program
// on a metrics.csv and on bad input (exit 2 naming the file).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nxd/runtime/error.h"
#include "plot/canvas.h"
#include "plot/chart.h"
#include "plot/png.h"
#include "support/files.h"
#include "support/proc.h"

using namespace nxd::plot;
namespace fs = std::filesystem;

namespace {

uint32_t be32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

// Decodes what encode_png writes (palette, stored deflate blocks, filter 0), checking every
// chunk's CRC, the zlib header, each block's LEN/NLEN and the Adler-32.
IndexedImage decode(const std::string& png) {
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n"));
  IndexedImage img;
  std::string idat;
  for (size_t at = 8; at < png.size();) {
    const uint32_t n = be32(png, at);
    const std::string type = png.substr(at + 4, 4), data = png.substr(at + 8, n);
    const auto* body = reinterpret_cast<const uint8_t*>(png.data() + at + 4);
    EXPECT_EQ(be32(png, at + 8 + n), png_crc32(body, n + 4)) << type << " CRC";
    if (type == "IHDR") {
      img.width = static_cast<int>(be32(data, 0));
      img.height = static_cast<int>(be32(data, 4));
      EXPECT_EQ(data.substr(8), std::string({8, 3, 0, 0, 0}));
    } else if (type == "PLTE") {
      for (size_t i = 0; i + 2 < data.size(); i += 3)
        img.palette.push_back({uint8_t(data[i]), uint8_t(data[i + 1]), uint8_t(data[i + 2])});
    } else if (type == "IDAT") {
      idat += data;
    }
    at += 12 + n;
  }
  EXPECT_EQ((static_cast<uint8_t>(idat[0]) * 256 + static_cast<uint8_t>(idat[1])) % 31, 0);
  std::string raw;
  size_t at = 2;
  for (bool last = false; !last;) {
    last = idat[at] & 1;
    const int len = uint8_t(idat[at + 1]) | uint8_t(idat[at + 2]) << 8;
    const int nlen = uint8_t(idat[at + 3]) | uint8_t(idat[at + 4]) << 8;
    EXPECT_EQ(len, (~nlen) & 0xffff);
    raw += idat.substr(at + 5, len);
    at += 5 + len;
  }
  EXPECT_EQ(be32(idat, at), adler32(reinterpret_cast<const uint8_t*>(raw.data()), raw.size()));
  for (int y = 0; y < img.height; ++y) {
    EXPECT_EQ(raw[y * (img.width + 1)], 0) << "filter of row " << y;
    for (int x = 0; x < img.width; ++x) img.pixels.push_back(raw[y * (img.width + 1) + 1 + x]);
  }
  return img;
}

size_t count(const IndexedImage& img, uint8_t color) {
  return static_cast<size_t>(std::count(img.pixels.begin(), img.pixels.end(), color));
}

}  // namespace

TEST(Png, KnownAnswerChecksums) {
  const std::string s = "123456789";
  EXPECT_EQ(png_crc32(reinterpret_cast<const uint8_t*>(s.data()), s.size()), 0xCBF43926u);
  const std::string w = "Wikipedia";
  EXPECT_EQ(adler32(reinterpret_cast<const uint8_t*>(w.data()), w.size()), 0x11E60398u);
}

TEST(Png, EncodesAndDecodesBackBitwise) {
  // 300 x 250: more than one 64 KiB stored block
  IndexedImage img{300, 250, {{0, 0, 0}, {255, 0, 0}, {9, 8, 7}}, {}};
  for (int i = 0; i < 300 * 250; ++i) img.pixels.push_back(static_cast<uint8_t>((i * 7 / 3) % 3));
  IndexedImage back = decode(encode_png(img));
  EXPECT_EQ(back.width, 300);
  EXPECT_EQ(back.height, 250);
  EXPECT_EQ(back.pixels, img.pixels);
  ASSERT_EQ(back.palette.size(), 3u);
  EXPECT_EQ(back.palette[2].b, 7);
  img.pixels[5] = 3;  // outside the palette
  EXPECT_THROW(encode_png(img), nxd::InvalidArgument);
}

TEST(Chart, NiceTicksAndLabels) {
  EXPECT_EQ(nice_ticks(0.0, 10.0), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(nice_ticks(1.62, 4.4), (std::vector<double>{2, 3, 4}));
  std::string labels;
  for (double t : nice_ticks(0.0, 1.0)) labels += tick_label(t) + " ";
  EXPECT_EQ(labels, "0 0.2 0.4 0.6 0.8 1 ");
  EXPECT_EQ(nice_ticks(1, 7e4, 7).size(), 7u);  // every 10k
  EXPECT_EQ(nice_ticks(3.0, 3.0).size(), 0u);
  EXPECT_EQ(tick_label(0.5), "0.5");
  EXPECT_EQ(tick_label(22000), "22k");
  EXPECT_EQ(tick_label(3.5e6), "3.5M");
}

TEST(Chart, DrawsEverySeriesAndTheLabels) {
  Series a{"loss", {1, 2, 3, 4}, {4, 3, 2.5, 2}, blue, false};
  Series b{"val_loss", {2, 4}, {3.2, 2.4}, orange, true};
  Series c{"tokens_per_s", {1, 2, 3, 4}, {1e4, 1.2e4, 1.1e4, 1.3e4}, green, false};
  IndexedImage img = render_chart({{"loss", {a, b}}, {"tokens/s", {c}}});
  EXPECT_EQ(img.width, 900);
  EXPECT_EQ(img.height, 2 * 280 + 24);
  EXPECT_GT(count(img, blue), 500u);   // a 2-pixel line across the panel
  EXPECT_GT(count(img, orange), 90u);  // two 7x7 markers + the legend
  EXPECT_GT(count(img, green), 500u);
  EXPECT_GT(count(img, black), 1000u);  // axes, ticks, text
  EXPECT_THROW(render_chart({{"empty", {}}}), nxd::InvalidArgument);
}

TEST(NxdPlot, PlotsAMetricsFileAndRefusesBadInput) {
  const fs::path d = nxd::testing::test_temp_dir("nxd_plot_test");
  {
    std::ofstream f(d / "metrics.csv");
    f << "step,loss,val_loss,lr,grad_norm,tokens_per_s,epoch,elapsed_s,sim_step_s\n";
    for (int s = 10; s <= 200; s += 10)
      f << s << "," << 5.0 / (1 + s / 50.0) << "," << (s % 50 == 0 ? "2.5" : "") << ",0.001,1,"
        << 20000 + s << ",0,1,0\n";
  }
  auto r = nxd::testing::run_process({NXD_PLOT_BIN, d.string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  std::ifstream in(d / "metrics.png", std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  IndexedImage img = decode(bytes.str());
  EXPECT_GT(count(img, blue), 500u);
  EXPECT_GT(count(img, orange), 90u);
  EXPECT_GT(count(img, green), 500u);

  auto missing = nxd::testing::run_process({NXD_PLOT_BIN, (d / "nope.csv").string()}, d);
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("nope.csv"), std::string::npos) << missing.err;
  std::ofstream(d / "other.csv") << "a,b\n1,2\n";
  auto other = nxd::testing::run_process({NXD_PLOT_BIN, (d / "other.csv").string()}, d);
  EXPECT_EQ(other.code, 2);
  EXPECT_NE(other.err.find("no column 'step'"), std::string::npos) << other.err;
  std::ofstream(d / "bad.csv") << "step,loss\n10,abc\n";
  auto bad = nxd::testing::run_process({NXD_PLOT_BIN, (d / "bad.csv").string()}, d);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("line 2 column 'loss'"), std::string::npos) << bad.err;
}
