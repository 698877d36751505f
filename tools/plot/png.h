#pragma once
// A minimal PNG writer: 8-bit palette images (color type 3) in one IDAT chunk whose zlib stream
// is made of stored (uncompressed) deflate blocks, so it needs no compression library. Every
// chunk carries its CRC-32 and the zlib stream its Adler-32, as the PNG specification
// (W3C PNG, 2nd edition) and RFC 1950/1951 require.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace nxd::plot {

struct Rgb {
  uint8_t r, g, b;
};

// width x height palette indices, row-major; each index < palette.size() <= 256.
struct IndexedImage {
  int width = 0, height = 0;
  std::vector<Rgb> palette;
  std::vector<uint8_t> pixels;
};

uint32_t png_crc32(const uint8_t* data, size_t n, uint32_t crc = 0);
uint32_t adler32(const uint8_t* data, size_t n);

// The PNG file's bytes. Throws InvalidArgument on an empty image, a pixel count that does not
// match, or an index outside the palette.
std::string encode_png(const IndexedImage& img);
// encode_png to `path` (IoError naming the path when it cannot be written).
void write_png(const std::string& path, const IndexedImage& img);

}  // namespace nxd::plot
