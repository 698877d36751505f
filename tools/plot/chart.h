#pragma once
// Line charts: panels stacked vertically, each with its own y axis, "nice" ticks, a grid, a
// legend and a title, sharing the x axis label. Rendered into a palette image (png.h).
#include <cstdint>
#include <string>
#include <vector>

#include "png.h"

namespace nxd::plot {

enum Color : uint8_t { white, black, grid_gray, blue, orange, green, dark_gray, kNumColors };
std::vector<Rgb> chart_palette();

struct Series {
  std::string name;
  std::vector<double> x, y;  // same length; drawn in x order as given
  Color color = blue;
  bool markers = false;  // a square at every point (sparse series, e.g. validation)
};

struct Panel {
  std::string title;
  std::vector<Series> series;  // series without points are listed in the legend only
};

struct ChartOptions {
  int width = 900;
  int panel_height = 280;
  std::string x_label = "step";
};

// "Nice" tick values (1, 2 or 5 x 10^k apart) covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);
// A tick label: short, no trailing zeros ("0.5", "1200", "25k", "3.5M").
std::string tick_label(double v);

// Throws InvalidArgument when no panel has a point or a series' x and y differ in length.
IndexedImage render_chart(const std::vector<Panel>& panels, const ChartOptions& o = {});

}  // namespace nxd::plot
