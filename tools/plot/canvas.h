#pragma once
// A palette canvas with what a line chart needs: pixels, thick lines, rectangles and text in a
// built-in 5x7 bitmap font (digits, lowercase letters — uppercase is drawn lowercase — and
// . - + / ( ) , : _ = %; any other character is drawn as a box).
#include <cstdint>
#include <string>

#include "png.h"

namespace nxd::plot {

class Canvas {
 public:
  Canvas(int width, int height, std::vector<Rgb> palette);  // filled with color 0
  int width() const { return img_.width; }
  int height() const { return img_.height; }
  void set(int x, int y, uint8_t color);  // ignored outside the canvas
  uint8_t at(int x, int y) const;
  // A line of `thickness` pixels (Bresenham, square pen).
  void line(double x0, double y0, double x1, double y1, uint8_t color, int thickness = 1);
  void fill_rect(int x0, int y0, int x1, int y1, uint8_t color);  // inclusive corners
  // Text with its top-left corner at (x, y); glyphs 5x7 scaled by `scale`, 1 column apart.
  void text(int x, int y, const std::string& s, uint8_t color, int scale = 2);
  static int text_width(const std::string& s, int scale = 2) {
    return static_cast<int>(s.size()) * 6 * scale;
  }
  const IndexedImage& image() const { return img_; }

 private:
  IndexedImage img_;
};

}  // namespace nxd::plot
