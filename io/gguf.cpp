// GGUF files (gguf.h): the bounded reader and the writer (the codecs: ggml_codec.cpp).
#include "nxd/io/gguf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "nxd/io/bounded_read.h"
#include "nxd/io/fileio.h"
#include "nxd/runtime/error.h"

namespace nxd::io {

namespace {

constexpr uint32_t kMagic = 0x46554747;             // "GGUF"
constexpr int64_t kMaxCount = int64_t{1} << 20;     // tensors, metadata entries
constexpr int64_t kMaxString = int64_t{1} << 24;    // bytes of one string
constexpr int64_t kMaxElements = int64_t{1} << 42;  // elements of one tensor
constexpr int kMaxArrayDepth = 4;

std::string where(const std::string& path) {
  return str("[gguf] ", shorten(path, ReadLimits::max_shown_path), ": ");
}

// Bounded sequential reads from an open file (pread in 1 MiB chunks).
class Cursor {
 public:
  Cursor(int fd, int64_t size, std::string path) : fd_(fd), size_(size), path_(std::move(path)) {}
  int64_t pos() const { return pos_; }
  int64_t left() const { return size_ - pos_; }
  void read(void* out, int64_t n, const char* what) {
    if (n > left())
      throw IoError(str(where(path_), "truncated: ", what, " needs ", n, " bytes at offset ", pos_,
                        ", the file has ", size_));
    auto* o = static_cast<char*>(out);
    while (n > 0) {
      if (pos_ < buf_pos_ || pos_ >= buf_pos_ + static_cast<int64_t>(buf_.size())) fill();
      const int64_t off = pos_ - buf_pos_;
      const int64_t k = std::min<int64_t>(n, static_cast<int64_t>(buf_.size()) - off);
      std::memcpy(o, buf_.data() + off, static_cast<size_t>(k));
      o += k, pos_ += k, n -= k;
    }
  }
  template <class T>
  T get(const char* what) {
    T v;
    read(&v, sizeof v, what);
    return v;
  }
  std::string string(const char* what) {
    const uint64_t n = get<uint64_t>(what);
    if (n > static_cast<uint64_t>(std::min(kMaxString, left())))
      throw IoError(str(where(path_), what, " has length ", n, " at offset ", pos_ - 8, " (limit ",
                        std::min(kMaxString, left()), ")"));
    std::string s(n, '\0');
    read(s.data(), static_cast<int64_t>(n), what);
    return s;
  }

 private:
  void fill() {
    buf_.resize(static_cast<size_t>(std::min<int64_t>(1 << 20, size_ - pos_)));
    int64_t got = 0;
    while (got < static_cast<int64_t>(buf_.size())) {
      const ssize_t r = ::pread(fd_, buf_.data() + got, buf_.size() - got, pos_ + got);
      if (r <= 0) throw IoError(str(where(path_), "read failed at offset ", pos_ + got));
      got += r;
    }
    buf_pos_ = pos_;
  }
  int fd_;
  int64_t size_, pos_ = 0, buf_pos_ = 0;
  std::string path_;
  std::vector<char> buf_;
};

struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};

int64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
      return 8;
    case GgufType::string:
      return 8;  // at least its length
    case GgufType::array:
      return 12;  // at least its element type and count
  }
  return 0;
}

nlohmann::json read_value(Cursor& c, GgufType t, GgufType* elem, int depth, const std::string& key,
                          const std::string& path) {
  switch (t) {
    case GgufType::u8:
      return c.get<uint8_t>("a u8");
    case GgufType::i8:
      return c.get<int8_t>("an i8");
    case GgufType::u16:
      return c.get<uint16_t>("a u16");
    case GgufType::i16:
      return c.get<int16_t>("an i16");
    case GgufType::u32:
      return c.get<uint32_t>("a u32");
    case GgufType::i32:
      return c.get<int32_t>("an i32");
    case GgufType::f32:
      return c.get<float>("an f32");
    case GgufType::u64:
      return c.get<uint64_t>("a u64");
    case GgufType::i64:
      return c.get<int64_t>("an i64");
    case GgufType::f64:
      return c.get<double>("an f64");
    case GgufType::boolean: {
      const uint8_t b = c.get<uint8_t>("a bool");
      if (b > 1) throw IoError(str(where(path), "metadata ", key, ": a bool of value ", int(b)));
      return b == 1;
    }
    case GgufType::string: {
      std::string s = c.string("a string");
      check_utf8(s, str(path, " metadata ", shorten(key)), "gguf");
      return s;
    }
    case GgufType::array: {
      if (depth >= kMaxArrayDepth)
        throw IoError(
            str(where(path), "metadata ", key, ": arrays nested deeper than ", kMaxArrayDepth));
      const uint32_t et = c.get<uint32_t>("an array's type");
      if (et > 12)
        throw IoError(str(where(path), "metadata ", key, ": unknown array element type ", et));
      const uint64_t n = c.get<uint64_t>("an array's length");
      const int64_t each = scalar_size(static_cast<GgufType>(et));
      if (n > static_cast<uint64_t>(c.left() / each))
        throw IoError(str(where(path), "metadata ", key, ": an array of ", n,
                          " elements does not fit the ", c.left(), " bytes left"));
      if (elem) *elem = static_cast<GgufType>(et);
      nlohmann::json a = nlohmann::json::array();
      for (uint64_t i = 0; i < n; ++i)
        a.push_back(read_value(c, static_cast<GgufType>(et), nullptr, depth + 1, key, path));
      return a;
    }
  }
  throw IoError(str(where(path), "metadata ", key, ": unknown value type ", uint32_t(t)));
}

}  // namespace

const char* ggml_type_name(uint32_t type) {
  static const char* names[] = {"f32",   "f16",   "q4_0",    "q4_1",   "q4_2",    "q4_3",  "q5_0",
                                "q5_1",  "q8_0",  "q8_1",    "q2_K",   "q3_K",    "q4_K",  "q5_K",
                                "q6_K",  "q8_K",  "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl",
                                "iq3_s", "iq2_s", "iq4_xs",  "i8",     "i16",     "i32",   "i64",
                                "f64",   "iq1_m", "bf16"};
  return type < std::size(names) ? names[type] : "?";
}

GgmlType ggml_type_from_name(const std::string& name) {
  for (GgmlType t : {GgmlType::f32, GgmlType::f16, GgmlType::bf16, GgmlType::q8_0, GgmlType::q4_0})
    if (name == ggml_type_name(static_cast<uint32_t>(t))) return t;
  throw ConfigError(
      str("[gguf] unknown tensor type '", shorten(name), "' (known: f32, f16, bf16, q8_0, q4_0)"));
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const GgufKV* GgufFile::find(const std::string& key) const {
  for (const auto& e : kv)
    if (e.key == key) return &e;
  return nullptr;
}

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

int64_t ggml_nbytes(GgmlType type, int64_t n) {
  switch (type) {
    case GgmlType::f32:
      return 4 * n;
    case GgmlType::f16:
    case GgmlType::bf16:
      return 2 * n;
    case GgmlType::q8_0:
      return n / 32 * 34;
    case GgmlType::q4_0:
      return n / 32 * 18;
  }
  return 0;
}

namespace {

// Bytes of a tensor of n elements and row length ne0 in any type nxd knows the size of; -1 for
// a type it does not (its data is then never read).
int64_t tensor_bytes(uint32_t type, int64_t n, int64_t ne0, const std::string& name,
                     const std::string& path) {
  switch (type) {
    case 0:
      return 4 * n;
    case 1:
    case 30:
      return 2 * n;
    case 2:
    case 8:
      if (ne0 % 32 != 0)
        throw IoError(str(where(path), "tensor ", name, " of type ", ggml_type_name(type),
                          " has rows of ", ne0, " values, not a multiple of its 32-value blocks"));
      return ggml_nbytes(static_cast<GgmlType>(type), n);
    default:
      return -1;
  }
}

// The nkv metadata entries of the header, each key once.
void read_metadata(Cursor& c, uint64_t nkv, GgufFile& f) {
  std::set<std::string> keys;
  for (uint64_t i = 0; i < nkv; ++i) {
    GgufKV e;
    e.key = c.string("a metadata key");
    if (!keys.insert(e.key).second)
      throw IoError(str(where(f.path), "metadata key ", shorten(e.key), " appears twice"));
    const uint32_t t = c.get<uint32_t>("a value type");
    if (t > 12)
      throw IoError(str(where(f.path), "metadata ", shorten(e.key), ": unknown value type ", t));
    e.type = static_cast<GgufType>(t);
    e.value = read_value(c, e.type, &e.elem, 0, shorten(e.key), f.path);
    f.kv.push_back(std::move(e));
  }
}

// One tensor's entry of the header: name (not in `names` yet), shape, type, offset and size.
GgufTensor read_tensor_info(Cursor& c, std::set<std::string>& names, const std::string& path) {
  GgufTensor t;
  t.name = c.string("a tensor name");
  if (!names.insert(t.name).second)
    throw IoError(str(where(path), "tensor ", shorten(t.name), " appears twice"));
  const uint32_t nd = c.get<uint32_t>("a dimension count");
  if (nd < 1 || nd > 4)
    throw IoError(
        str(where(path), "tensor ", shorten(t.name), " has ", nd, " dimensions (1 to 4)"));
  std::vector<int64_t> ne(nd);
  int64_t n = 1;
  for (uint32_t d = 0; d < nd; ++d) {
    const uint64_t v = c.get<uint64_t>("a dimension");
    if (v == 0 || v > static_cast<uint64_t>(kMaxElements) ||
        static_cast<uint64_t>(n) > static_cast<uint64_t>(kMaxElements) / v)
      throw IoError(str(where(path), "tensor ", shorten(t.name), ": dimension ", d, " is ", v,
                        " (at least 1; at most ", kMaxElements, " elements in all)"));
    ne[d] = static_cast<int64_t>(v);
    n *= ne[d];
  }
  t.shape.assign(ne.rbegin(), ne.rend());
  t.type = c.get<uint32_t>("a tensor type");
  t.offset = c.get<uint64_t>("a tensor offset");
  t.nbytes = tensor_bytes(t.type, n, ne[0], shorten(t.name), path);
  return t;
}

// Every tensor aligned, inside the data section of a file of `file_size` bytes, and none
// overlapping another.
void check_tensor_spans(const GgufFile& f, uint64_t file_size) {
  const uint64_t data = file_size > f.data_offset ? file_size - f.data_offset : 0;
  std::vector<std::pair<uint64_t, const GgufTensor*>> spans;
  for (const GgufTensor& t : f.tensors) {
    if (t.offset % f.alignment != 0)
      throw IoError(str(where(f.path), "tensor ", shorten(t.name), " at offset ", t.offset,
                        ", not a multiple of the alignment ", f.alignment));
    if (t.nbytes >= 0 && (t.offset > data || static_cast<uint64_t>(t.nbytes) > data - t.offset))
      throw IoError(str(where(f.path), "tensor ", shorten(t.name), " (", t.nbytes,
                        " bytes at offset ", t.offset, ") lies past the data section's ", data,
                        " bytes (a truncated file?)"));
    if (t.nbytes >= 0) spans.push_back({t.offset, &t});
  }
  std::sort(spans.begin(), spans.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i - 1].first + static_cast<uint64_t>(spans[i - 1].second->nbytes) > spans[i].first)
      throw IoError(str(where(f.path), "tensors ", shorten(spans[i - 1].second->name), " and ",
                        shorten(spans[i].second->name), " overlap"));
}

}  // namespace

GgufFile read_gguf(const std::filesystem::path& path) {
  GgufFile f;
  f.path = path.string();
  Fd fd{open_regular_file(f.path, "GGUF file", "gguf")};
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw IoError(str(where(f.path), "cannot stat"));
  Cursor c(fd.fd, st.st_size, f.path);
  if (c.get<uint32_t>("the magic") != kMagic)
    throw IoError(str(where(f.path), "not a GGUF file (its first bytes are not \"GGUF\")"));
  f.version = c.get<uint32_t>("the version");
  if (f.version != 2 && f.version != 3)
    throw IoError(str(where(f.path), "GGUF version ", f.version, " (nxd reads versions 2 and 3)"));
  const uint64_t nt = c.get<uint64_t>("the tensor count"), nkv = c.get<uint64_t>("the kv count");
  if (nt > static_cast<uint64_t>(kMaxCount) || nkv > static_cast<uint64_t>(kMaxCount))
    throw IoError(str(where(f.path), nt, " tensors and ", nkv, " metadata entries (limit ",
                      kMaxCount, " each)"));
  read_metadata(c, nkv, f);
  if (const GgufKV* a = f.find("general.alignment")) {
    const uint64_t v = a->value.is_number_unsigned() ? a->value.get<uint64_t>() : 0;
    if (a->type != GgufType::u32 || v == 0 || v > (1u << 16) || (v & (v - 1)) != 0)
      throw IoError(str(where(f.path), "general.alignment must be a u32 power of two up to 65536"));
    f.alignment = v;
  }
  std::set<std::string> names;
  for (uint64_t i = 0; i < nt; ++i) f.tensors.push_back(read_tensor_info(c, names, f.path));
  f.data_offset = (static_cast<uint64_t>(c.pos()) + f.alignment - 1) / f.alignment * f.alignment;
  check_tensor_spans(f, static_cast<uint64_t>(st.st_size));
  return f;
}

std::vector<uint8_t> read_gguf_bytes(const GgufFile& f, const GgufTensor& t) {
  if (t.nbytes < 0)
    throw IoError(str(where(f.path), "tensor ", shorten(t.name), " has type ",
                      ggml_type_name(t.type), " (", t.type,
                      "), which nxd does not read (f32, f16, bf16, q8_0 and q4_0 it does: "
                      "llama.cpp's llama-quantize converts between them)"));
  Fd fd{open_regular_file(f.path, "GGUF file", "gguf")};
  std::vector<uint8_t> b(static_cast<size_t>(t.nbytes));
  int64_t got = 0;
  while (got < t.nbytes) {
    const ssize_t r = ::pread(fd.fd, b.data() + got, static_cast<size_t>(t.nbytes - got),
                              static_cast<off_t>(f.data_offset + t.offset + got));
    if (r <= 0)
      throw IoError(str(where(f.path), "tensor ", shorten(t.name),
                        ": read failed (the file "
                        "changed since it was opened?)"));
    got += r;
  }
  return b;
}

std::vector<float> read_gguf_f32(const GgufFile& f, const GgufTensor& t) {
  const std::vector<uint8_t> b = read_gguf_bytes(f, t);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  ggml_decode(static_cast<GgmlType>(t.type), b.data(), t.numel(), out.data());
  return out;
}

// ---- the writer ----

namespace {

void put(std::string& o, const void* p, size_t n) {
  o.append(static_cast<const char*>(p), n);
}
template <class T>
void put(std::string& o, T v) {
  put(o, &v, sizeof v);
}
void put_string(std::string& o, const std::string& s) {
  put<uint64_t>(o, s.size());
  o += s;
}

void put_value(std::string& o, GgufType t, GgufType elem, const nlohmann::json& v) {
  switch (t) {
    case GgufType::u8:
      return put<uint8_t>(o, v.get<uint8_t>());
    case GgufType::i8:
      return put<int8_t>(o, v.get<int8_t>());
    case GgufType::u16:
      return put<uint16_t>(o, v.get<uint16_t>());
    case GgufType::i16:
      return put<int16_t>(o, v.get<int16_t>());
    case GgufType::u32:
      return put<uint32_t>(o, v.get<uint32_t>());
    case GgufType::i32:
      return put<int32_t>(o, v.get<int32_t>());
    case GgufType::f32:
      return put<float>(o, v.get<float>());
    case GgufType::u64:
      return put<uint64_t>(o, v.get<uint64_t>());
    case GgufType::i64:
      return put<int64_t>(o, v.get<int64_t>());
    case GgufType::f64:
      return put<double>(o, v.get<double>());
    case GgufType::boolean:
      return put<uint8_t>(o, v.get<bool>() ? 1 : 0);
    case GgufType::string:
      return put_string(o, v.get<std::string>());
    case GgufType::array:
      put<uint32_t>(o, static_cast<uint32_t>(elem));
      put<uint64_t>(o, v.size());
      for (const auto& e : v) put_value(o, elem, GgufType::u32, e);
      return;
  }
}

}  // namespace

void write_gguf(const std::filesystem::path& path, const std::vector<GgufKV>& kv,
                const std::vector<GgufWriteTensor>& tensors) {
  constexpr uint64_t align = 32;
  std::string o;
  put<uint32_t>(o, kMagic);
  put<uint32_t>(o, 3);
  put<uint64_t>(o, tensors.size());
  put<uint64_t>(o, kv.size());
  for (const GgufKV& e : kv) {
    NXD_CHECK(e.key != "general.alignment", "[gguf] the writer sets general.alignment itself");
    put_string(o, e.key);
    put<uint32_t>(o, static_cast<uint32_t>(e.type));
    put_value(o, e.type, e.elem, e.value);
  }
  uint64_t offset = 0;
  for (const GgufWriteTensor& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    NXD_CHECK(static_cast<int64_t>(t.bytes.size()) == ggml_nbytes(t.type, n), "[gguf] tensor ",
              t.name, ": ", t.bytes.size(), " bytes for ", n, " values of ",
              ggml_type_name(static_cast<uint32_t>(t.type)));
    put_string(o, t.name);
    put<uint32_t>(o, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put<uint64_t>(o, *it);
    put<uint32_t>(o, static_cast<uint32_t>(t.type));
    put<uint64_t>(o, offset);
    offset = (offset + t.bytes.size() + align - 1) / align * align;
  }
  o.resize((o.size() + align - 1) / align * align, '\0');
  for (const GgufWriteTensor& t : tensors) {
    put(o, t.bytes.data(), t.bytes.size());
    o.resize((o.size() + align - 1) / align * align, '\0');
  }
  write_file_atomic(path, o);
}

}  // namespace nxd::io
