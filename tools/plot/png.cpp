#include "png.h"

#include <fstream>

#include "nxd/runtime/error.h"

namespace nxd::plot {

namespace {

void put32(std::string& s, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((v >> shift) & 0xff));
}

void chunk(std::string& out, const char* type, const std::string& data) {
  put32(out, static_cast<uint32_t>(data.size()));
  std::string body = std::string(type, 4) + data;
  out += body;
  put32(out, png_crc32(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
}

// The zlib stream of `raw` in stored deflate blocks (at most 65535 bytes each).
std::string zlib_stored(const std::vector<uint8_t>& raw) {
  std::string z = {0x78, 0x01};  // deflate, 32 KiB window, no dictionary, check bits
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    const bool last = pos + n == raw.size();
    z.push_back(static_cast<char>(last ? 1 : 0));  // BFINAL, BTYPE = 00 (stored)
    const uint16_t len = static_cast<uint16_t>(n), nlen = static_cast<uint16_t>(~len);
    z.push_back(static_cast<char>(len & 0xff));
    z.push_back(static_cast<char>(len >> 8));
    z.push_back(static_cast<char>(nlen & 0xff));
    z.push_back(static_cast<char>(nlen >> 8));
    z.append(reinterpret_cast<const char*>(raw.data() + pos), n);
    pos += n;
  } while (pos < raw.size());
  put32(z, adler32(raw.data(), raw.size()));
  return z;
}

}  // namespace

uint32_t png_crc32(const uint8_t* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const uint8_t* data, size_t n) {
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < n; ++i) {
    a = (a + data[i]) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

std::string encode_png(const IndexedImage& img) {
  NXD_CHECK(img.width > 0 && img.height > 0, "[png] empty image ", img.width, "x", img.height);
  NXD_CHECK(img.pixels.size() == static_cast<size_t>(img.width) * img.height, "[png] ",
            img.pixels.size(), " pixels for a ", img.width, "x", img.height, " image");
  NXD_CHECK(!img.palette.empty() && img.palette.size() <= 256, "[png] palette of ",
            img.palette.size(), " colors (1 to 256)");
  std::vector<uint8_t> raw;  // each row: filter type 0, then its indices
  raw.reserve(img.pixels.size() + img.height);
  for (int y = 0; y < img.height; ++y) {
    raw.push_back(0);
    for (int x = 0; x < img.width; ++x) {
      const uint8_t p = img.pixels[static_cast<size_t>(y) * img.width + x];
      NXD_CHECK(p < img.palette.size(), "[png] pixel (", x, ", ", y, ") has index ", int(p),
                " outside the palette of ", img.palette.size());
      raw.push_back(p);
    }
  }
  std::string out = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  put32(ihdr, static_cast<uint32_t>(img.width));
  put32(ihdr, static_cast<uint32_t>(img.height));
  ihdr += std::string{8, 3, 0, 0, 0};  // bit depth 8, palette, deflate, filter 0, no interlace
  chunk(out, "IHDR", ihdr);
  std::string plte;
  for (const Rgb& c : img.palette) plte += std::string{char(c.r), char(c.g), char(c.b)};
  chunk(out, "PLTE", plte);
  chunk(out, "IDAT", zlib_stored(raw));
  chunk(out, "IEND", "");
  return out;
}

void write_png(const std::string& path, const IndexedImage& img) {
  const std::string bytes = encode_png(img);
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) throw IoError(str("[png] cannot write '", path, "'"));
}

}  // namespace nxd::plot
