#include "chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "canvas.h"
#include "nxd/runtime/error.h"

namespace nxd::plot {

namespace {

constexpr int kLeft = 80, kRight = 24, kTop = 34, kBottom = 50;  // margins of a panel

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  void add(double v) {
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  bool empty() const { return !(lo <= hi); }
  void pad() {  // a flat series gets a visible band; others 5% headroom
    const double span = hi - lo;
    const double p = span > 0 ? 0.05 * span : std::max(1e-9, 0.1 * std::abs(lo) + (lo == 0));
    lo -= p, hi += p;
  }
};

struct Frame {  // a panel's plotting area and data ranges
  int x0, y0, x1, y1;
  Range xr, yr;
  double px(double x) const { return x0 + (x - xr.lo) / (xr.hi - xr.lo) * (x1 - x0); }
  double py(double y) const { return y1 - (y - yr.lo) / (yr.hi - yr.lo) * (y1 - y0); }
};

void draw_axes(Canvas& c, const Frame& f, const std::string& title) {
  for (double t : nice_ticks(f.yr.lo, f.yr.hi)) {
    const int y = static_cast<int>(std::lround(f.py(t)));
    c.line(f.x0, y, f.x1, y, grid_gray);
    const std::string s = tick_label(t);
    c.text(f.x0 - 8 - Canvas::text_width(s), y - 7, s, black);
  }
  for (double t : nice_ticks(f.xr.lo, f.xr.hi, 8)) {
    const int x = static_cast<int>(std::lround(f.px(t)));
    c.line(x, f.y0, x, f.y1, grid_gray);
    const std::string s = tick_label(t);
    c.text(x - Canvas::text_width(s) / 2, f.y1 + 8, s, black);
  }
  c.line(f.x0, f.y0, f.x0, f.y1, black);
  c.line(f.x0, f.y1, f.x1, f.y1, black);
  c.text(f.x0, f.y0 - 24, title, black);
}

void draw_series(Canvas& c, const Frame& f, const Series& s) {
  for (size_t i = 0; i < s.x.size(); ++i) {
    if (!std::isfinite(s.y[i])) continue;
    if (i > 0 && std::isfinite(s.y[i - 1]))
      c.line(f.px(s.x[i - 1]), f.py(s.y[i - 1]), f.px(s.x[i]), f.py(s.y[i]), s.color, 2);
    if (s.markers) {
      const int x = static_cast<int>(std::lround(f.px(s.x[i])));
      const int y = static_cast<int>(std::lround(f.py(s.y[i])));
      c.fill_rect(x - 3, y - 3, x + 3, y + 3, s.color);
    }
  }
}

// In the title row, right-aligned: a colored dash and the name of each series.
void draw_legend(Canvas& c, const Frame& f, const std::vector<Series>& series) {
  int x = f.x1;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    x -= Canvas::text_width(it->name) + 34;
    c.line(x, f.y0 - 17, x + 22, f.y0 - 17, it->color, 3);
    c.text(x + 28, f.y0 - 24, it->name, dark_gray);
    x -= 16;
  }
}

}  // namespace

std::vector<Rgb> chart_palette() {
  return {{255, 255, 255}, {0, 0, 0},     {225, 225, 225}, {31, 119, 180},
          {255, 127, 14},  {44, 160, 44}, {80, 80, 80}};
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo) || target < 1) return {};
  const double raw = (hi - lo) / target, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double k = std::ceil(lo / step); k * step <= hi + 1e-9 * step; k += 1)
    t.push_back(k == 0 ? 0.0 : k * step);
  return t;
}

std::string tick_label(double v) {
  char buf[32];
  const double a = std::abs(v);
  if (a >= 1e9)
    std::snprintf(buf, sizeof buf, "%.4gG", v / 1e9);
  else if (a >= 1e6)
    std::snprintf(buf, sizeof buf, "%.4gM", v / 1e6);
  else if (a >= 1e4)
    std::snprintf(buf, sizeof buf, "%.4gk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

IndexedImage render_chart(const std::vector<Panel>& panels, const ChartOptions& o) {
  NXD_CHECK(!panels.empty(), "[plot] no panels");
  const int h = static_cast<int>(panels.size()) * o.panel_height + 24;
  Canvas c(o.width, h, chart_palette());
  bool any = false;
  for (size_t p = 0; p < panels.size(); ++p) {
    Frame f{kLeft, static_cast<int>(p) * o.panel_height + kTop, o.width - kRight,
            static_cast<int>(p + 1) * o.panel_height - kBottom + 24};
    for (const Series& s : panels[p].series) {
      NXD_CHECK(s.x.size() == s.y.size(), "[plot] series '", s.name, "' has ", s.x.size(),
                " x values and ", s.y.size(), " y values");
      for (size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(s.y[i])) f.xr.add(s.x[i]), f.yr.add(s.y[i]);
    }
    if (f.xr.empty()) continue;  // nothing to draw in this panel
    any = true;
    f.yr.pad();
    if (!(f.xr.hi > f.xr.lo)) f.xr.pad();
    draw_axes(c, f, panels[p].title);
    for (const Series& s : panels[p].series) draw_series(c, f, s);
    draw_legend(c, f, panels[p].series);
  }
  NXD_CHECK(any, "[plot] no finite points to draw");
  c.text(kLeft + (o.width - kLeft - kRight - Canvas::text_width(o.x_label)) / 2, h - 22, o.x_label,
         black);
  return c.image();
}

}  // namespace nxd::plot
