#include "canvas.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string_view>

#include "nxd/runtime/error.h"

namespace nxd::plot {

namespace {

// 5x7 glyphs, rows top to bottom, '#' = ink.
const std::map<char, const char*>& font() {
  static const std::map<char, const char*> f = {
      {'0', ".###.#...##..###.#.###..##...#.###."}, {'1', "..#...##....#....#....#....#...###."},
      {'2', ".###.#...#....#...#...#...#...#####"}, {'3', "#####...#...#.....#.....##...#.###."},
      {'4', "...#...##..#.#.#..#.#####...#....#."}, {'5', "######....####.....#....##...#.###."},
      {'6', "..##..#...#....####.#...##...#.###."}, {'7', "#####....#...#...#...#....#....#..."},
      {'8', ".###.#...##...#.###.#...##...#.###."}, {'9', ".###.#...##...#.####....#...#..##.."},
      {'.', "..........................##...##.."}, {'-', "...............#####..............."},
      {'+', ".......#....#..#####..#....#......."}, {'/', ".........#...#...#...#...#........."},
      {'(', "...#...#...#....#....#.....#.....#."}, {')', ".#.....#.....#....#....#...#...#..."},
      {',', ".....................##....#...#..."}, {':', "......##...##........##...##......."},
      {'_', "..............................#####"}, {'=', "..........#####.....#####.........."},
      {'%', "##...##..#...#...#...#...#..##...##"}, {' ', "..................................."},
      {'a', "...........###.....#.#####...#.####"}, {'b', "#....#....#.##.##..##...##...#####."},
      {'c', "...........###.#....#....#...#.###."}, {'d', "....#....#.##.##..###...##...#.####"},
      {'e', "...........###.#...#######.....###."}, {'f', "..##..#..#.#...###...#....#....#..."},
      {'g', "......#####...##...#.####....#.###."}, {'h', "#....#....#.##.##..##...##...##...#"},
      {'i', "..#........##....#....#....#...###."}, {'j', "...#........##....#....#.#..#..##.."},
      {'k', "#....#....#..#.#.#..##...#.#..#..#."}, {'l', ".##....#....#....#....#....#...###."},
      {'m', "..........##.#.#.#.##.#.##...##...#"}, {'n', "..........#.##.##..##...##...##...#"},
      {'o', "...........###.#...##...##...#.###."}, {'p', "..........####.#...#####.#....#...."},
      {'q', "...........##.##..##.####....#....#"}, {'r', "..........#.##.##..##....#....#...."},
      {'s', "...........###.#.....###.....#####."}, {'t', ".#....#...###...#....#....#..#..##."},
      {'u', "..........#...##...##...##..##.##.#"}, {'v', "..........#...##...##...#.#.#...#.."},
      {'w', "..........#...##...##.#.##.#.#.#.#."}, {'x', "..........#...#.#.#...#...#.#.#...#"},
      {'y', "..........#...##...#.####....#.###."}, {'z', "..........#####...#...#...#...#####"},
  };
  static const bool checked = [] {
    for (const auto& [c, g] : f)
      NXD_CHECK(std::string_view(g).size() == 35, "[plot] glyph '", c, "' is not 5x7");
    return true;
  }();
  (void)checked;
  return f;
}

}  // namespace

Canvas::Canvas(int width, int height, std::vector<Rgb> palette) {
  img_.width = width;
  img_.height = height;
  img_.palette = std::move(palette);
  img_.pixels.assign(static_cast<size_t>(width) * height, 0);
}

void Canvas::set(int x, int y, uint8_t color) {
  if (x < 0 || y < 0 || x >= img_.width || y >= img_.height) return;
  img_.pixels[static_cast<size_t>(y) * img_.width + x] = color;
}

uint8_t Canvas::at(int x, int y) const {
  return img_.pixels.at(static_cast<size_t>(y) * img_.width + x);
}

void Canvas::line(double x0, double y0, double x1, double y1, uint8_t color, int thickness) {
  int ax = static_cast<int>(std::lround(x0)), ay = static_cast<int>(std::lround(y0));
  const int bx = static_cast<int>(std::lround(x1)), by = static_cast<int>(std::lround(y1));
  const int dx = std::abs(bx - ax), dy = -std::abs(by - ay);
  const int sx = ax < bx ? 1 : -1, sy = ay < by ? 1 : -1;
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  for (int err = dx + dy;;) {
    fill_rect(ax + lo, ay + lo, ax + hi, ay + hi, color);
    if (ax == bx && ay == by) break;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, ax += sx;
    if (e2 <= dx) err += dx, ay += sy;
  }
}

void Canvas::fill_rect(int x0, int y0, int x1, int y1, uint8_t color) {
  for (int y = y0; y <= y1; ++y)
    for (int x = x0; x <= x1; ++x) set(x, y, color);
}

void Canvas::text(int x, int y, const std::string& s, uint8_t color, int scale) {
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
    auto it = font().find(c);
    const int gx = x + static_cast<int>(i) * 6 * scale;
    for (int r = 0; r < 7; ++r)
      for (int col = 0; col < 5; ++col) {
        const bool ink = it == font().end() ? (r == 0 || r == 6 || col == 0 || col == 4)
                                            : it->second[r * 5 + col] == '#';
        if (ink)
          fill_rect(gx + col * scale, y + r * scale, gx + col * scale + scale - 1,
                    y + r * scale + scale - 1, color);
      }
  }
}

}  // namespace nxd::plot
