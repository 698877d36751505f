#include "nxd/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "nxd/io/bounded_read.h"
#include "nxd/io/crc32c.h"

namespace nxd::io {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kCrcPrefix = "nxd.crc32c.";
constexpr uint64_t kMaxHeader = 100u << 20;  // safetensors' own limit
constexpr uint32_t kZstdMagic = 0xFD2FB528u;

DType dtype_from_st(const std::string& s, bool* ok) {
  *ok = true;
  if (s == "F32") return DType::f32;
  if (s == "BF16") return DType::bf16;
  if (s == "F64") return DType::f64;
  if (s == "I32") return DType::i32;
  if (s == "I64") return DType::i64;
  *ok = false;
  return DType::f32;
}

// The bytes of a host tensor, contiguous (a copy only when it is strided).
Tensor host_bytes(const Tensor& t, const std::string& name) {
  NXD_CHECK(t.defined(), "[safetensors] tensor '", name, "' is undefined");
  NXD_CHECK(!t.is_meta(), "[safetensors] tensor '", name, "' is on the meta device (no data)");
  Tensor d = t.detach();
  return d.is_contiguous() ? d : d.contiguous();
}

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  throw FileError(str("[safetensors] ", file, ": ", what));
}

}  // namespace

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f64:
      return "F64";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
  }
  return "?";
}

const TensorInfo* SafetensorsHeader::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string encode_header(const std::vector<std::pair<std::string, Tensor>>& tensors,
                          const std::vector<uint32_t>& crcs,
                          const std::map<std::string, std::string>& metadata) {
  NXD_CHECK(crcs.size() == tensors.size(), "[safetensors] ", crcs.size(), " checksums for ",
            tensors.size(), " tensors");
  ojson h = ojson::object();
  ojson meta = ojson::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : metadata) meta[k] = v;
  std::set<std::string> seen;
  int64_t off = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    NXD_CHECK(!name.empty() && name != "__metadata__", "[safetensors] invalid tensor name '", name,
              "'");
    NXD_CHECK(seen.insert(name).second, "[safetensors] duplicate tensor name '", name, "'");
    const int64_t n = t.nbytes();
    h[name] = {{"dtype", safetensors_dtype(t.dtype())},
               {"shape", t.shape()},
               {"data_offsets", {off, off + n}}};
    meta[kCrcPrefix + name] = crc_hex(crcs[i]);
    off += n;
  }
  ojson out = ojson::object();
  out["__metadata__"] = meta;
  for (auto& [k, v] : h.items()) out[k] = v;
  std::string json = out.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return bytes + json;
}

SafetensorsHeader parse_header(const std::string& json, const std::string& file) {
  SafetensorsHeader h;
  ojson j;
  try {
    j = ojson::parse(json);
  } catch (const std::exception& e) {
    bad(file, str("header is not valid JSON: ", e.what()));
  }
  if (!j.is_object()) bad(file, "header is not a JSON object");
  std::map<std::string, uint32_t> crcs;
  for (const auto& [key, v] : j.items()) {
    if (key == "__metadata__") {
      if (!v.is_object()) bad(file, "__metadata__ is not an object");
      for (const auto& [mk, mv] : v.items()) {
        if (!mv.is_string()) bad(file, str("__metadata__ value of '", mk, "' is not a string"));
        const std::string s = mv.get<std::string>();
        if (mk.rfind(kCrcPrefix, 0) == 0) {
          uint32_t c = 0;
          if (!parse_crc_hex(s, &c))
            bad(file, str("checksum of tensor '", mk.substr(std::strlen(kCrcPrefix)),
                          "' is malformed: '", s, "'"));
          crcs[mk.substr(std::strlen(kCrcPrefix))] = c;
        } else {
          h.metadata[mk] = s;
        }
      }
      continue;
    }
    TensorInfo t;
    t.name = key;
    const std::string where = str("tensor '", key, "'");
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      bad(file, where + " needs dtype, shape and data_offsets");
    const auto& dt = v["dtype"];
    bool ok = dt.is_string();
    if (ok) t.dtype = dtype_from_st(dt.get<std::string>(), &ok);
    if (!ok) bad(file, str(where, " has an unsupported dtype ", dt.dump()));
    if (!v["shape"].is_array()) bad(file, where + ": shape is not an array");
    int64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        bad(file, str(where, ": bad shape ", v["shape"].dump()));
      const int64_t x = d.get<int64_t>();
      if (x != 0 && numel > (int64_t{1} << 50) / x)
        bad(file, str(where, ": shape ", v["shape"].dump(), " is too large"));
      numel *= x;
      t.shape.push_back(x);
    }
    const auto& o = v["data_offsets"];
    if (!o.is_array() || o.size() != 2 || !o[0].is_number_integer() || !o[1].is_number_integer() ||
        o[0].get<int64_t>() < 0 || o[1].get<int64_t>() < o[0].get<int64_t>())
      bad(file, str(where, ": bad data_offsets ", o.dump()));
    t.begin = o[0].get<int64_t>();
    t.end = o[1].get<int64_t>();
    if (t.nbytes() != numel * dtype_size(t.dtype))
      bad(file, str(where, ": data_offsets ", o.dump(), " hold ", t.nbytes(), " bytes but ",
                    safetensors_dtype(t.dtype), shape_str(t.shape), " needs ",
                    numel * dtype_size(t.dtype)));
    h.tensors.push_back(std::move(t));
  }
  std::stable_sort(h.tensors.begin(), h.tensors.end(),
                   [](const TensorInfo& a, const TensorInfo& b) { return a.begin < b.begin; });
  int64_t off = 0;
  for (auto& t : h.tensors) {
    if (t.begin != off)
      bad(file, str("tensor '", t.name, "' starts at byte ", t.begin, " of the data, expected ",
                    off, " (tensors must be packed without gaps or overlaps)"));
    off = t.end;
    auto it = crcs.find(t.name);
    if (it != crcs.end()) {
      t.crc = it->second;
      crcs.erase(it);
    }
  }
  if (!crcs.empty())
    bad(file, str("checksum for a tensor that is not in the file: '", crcs.begin()->first, "'"));
  h.data_size = off;
  return h;
}

WriteStats write_safetensors(const fs::path& path,
                             const std::vector<std::pair<std::string, Tensor>>& tensors,
                             const std::map<std::string, std::string>& metadata,
                             const SafetensorsWriteOptions& opts) {
  std::vector<std::pair<std::string, Tensor>> data;
  std::vector<uint32_t> crcs;
  data.reserve(tensors.size());
  WriteStats st;
  for (const auto& [name, t] : tensors) {
    Tensor b = host_bytes(t, name);
    crcs.push_back(crc32c(b.raw_data(), static_cast<size_t>(b.nbytes())));
    st.data_bytes += b.nbytes();
    data.emplace_back(name, b);
  }
  const std::string head = encode_header(data, crcs, metadata);
  AtomicFile f(path, opts.sync);
  if (!opts.compress) {
    f.write(head.data(), head.size());
    for (const auto& [name, t] : data) f.write(t.raw_data(), static_cast<size_t>(t.nbytes()));
  } else {
    std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
    NXD_CHECK_T(InternalError, cctx != nullptr, "[safetensors] ZSTD_createCCtx failed");
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, opts.zstd_level);
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setPledgedSrcSize(cctx.get(),
                                static_cast<unsigned long long>(head.size() + st.data_bytes));
    std::vector<char> out(size_t{4} << 20);
    auto feed = [&](const void* p, size_t n, ZSTD_EndDirective mode) {
      ZSTD_inBuffer in{p, n, 0};
      while (true) {
        ZSTD_outBuffer ob{out.data(), out.size(), 0};
        const size_t r = ZSTD_compressStream2(cctx.get(), &ob, &in, mode);
        if (ZSTD_isError(r))
          throw FileError(str("[safetensors] zstd compression of '", path.string(),
                              "': ", ZSTD_getErrorName(r)));
        f.write(out.data(), ob.pos);
        if (mode == ZSTD_e_end ? r == 0 : in.pos == in.size) break;
      }
    };
    feed(head.data(), head.size(), ZSTD_e_continue);
    for (const auto& [name, t] : data)
      feed(t.raw_data(), static_cast<size_t>(t.nbytes()), ZSTD_e_continue);
    feed(nullptr, 0, ZSTD_e_end);
  }
  st.file_bytes = f.bytes_written();
  f.commit();
  return st;
}

// ---------------------------------------------------------------- reading

struct SafetensorsReader::Source {
  int fd = -1;
  bool zstd = false;
  ZSTD_DCtx* dctx = nullptr;
  std::vector<char> in;
  ZSTD_inBuffer ib{nullptr, 0, 0};
  bool file_eof = false;
  size_t frame_left = 1;  // ZSTD_decompressStream's last return (0: frame complete)
  std::string error;      // set when read() stops early for another reason than EOF

  ~Source() {
    if (dctx) ZSTD_freeDCtx(dctx);
    if (fd >= 0) ::close(fd);
  }
  // zstd: whether the file holds nothing after the frame.
  bool nothing_after_frame() {
    if (ib.pos < ib.size) return false;
    char c;
    ssize_t r;
    do r = ::read(fd, &c, 1);
    while (r < 0 && errno == EINTR);
    return r == 0;
  }
  // Reads up to n bytes; fewer only at the end of the data or on an error (see `error`).
  size_t read(void* dst, size_t n) {
    char* p = static_cast<char*>(dst);
    size_t got = 0;
    if (!zstd) {
      while (got < n) {
        const ssize_t r = ::read(fd, p + got, std::min<size_t>(n - got, size_t{1} << 30));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
          error = std::strerror(errno);
          break;
        }
        if (r == 0) break;
        got += static_cast<size_t>(r);
      }
      return got;
    }
    ZSTD_outBuffer ob{dst, n, 0};
    while (ob.pos < ob.size) {
      if (ib.pos == ib.size && !file_eof) {
        const ssize_t r = ::read(fd, in.data(), in.size());
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
          error = std::strerror(errno);
          break;
        }
        if (r == 0) file_eof = true;
        ib = {in.data(), static_cast<size_t>(r), 0};
      }
      if (frame_left == 0) break;  // the frame ended: nothing more to give
      const size_t before = ob.pos;
      const size_t ret = ZSTD_decompressStream(dctx, &ob, &ib);
      if (ZSTD_isError(ret)) {
        error = str("zstd: ", ZSTD_getErrorName(ret));
        break;
      }
      frame_left = ret;
      if (ob.pos == before && ib.pos == ib.size && file_eof) break;  // truncated frame
    }
    return ob.pos;
  }
};

SafetensorsReader::SafetensorsReader(const fs::path& path) : path_(path) {
  const std::string file = path.string();
  src_ = std::make_unique<Source>();
  try {  // regular files only: a FIFO or device is refused before anything blocks on it
    src_->fd = open_regular_file(file, "", "safetensors");
  } catch (const IoError& e) {
    bad(file, str("cannot open: ", e.what()));
  }
  struct stat sb {};
  if (::fstat(src_->fd, &sb) == 0) file_size_ = sb.st_size;
  unsigned char len8[8];
  if (::pread(src_->fd, len8, 8, 0) != 8)
    bad(file, "truncated: shorter than the 8-byte header length");
  uint32_t magic = 0;
  std::memcpy(&magic, len8, 4);
  if (magic == kZstdMagic) {
    compressed_ = true;
    src_->zstd = true;
    src_->dctx = ZSTD_createDCtx();
    src_->in.resize(ZSTD_DStreamInSize() * 8);
  }
  if (src_->read(len8, 8) != 8) bad(file, "truncated: shorter than the 8-byte header length");
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len8[i];
  if (len < 2 || len > kMaxHeader)
    bad(file, str("header length ", len, " is out of range (2..", kMaxHeader, ")"));
  std::string json(len, '\0');
  if (src_->read(json.data(), len) != len)
    bad(file, str("truncated inside the ", len, "-byte header"));
  header_ = parse_header(json, file);
  header_.data_start = 8 + static_cast<int64_t>(len);
  if (!compressed_ && file_size_ != header_.data_start + header_.data_size) {
    for (const auto& t : header_.tensors)
      if (header_.data_start + t.end > file_size_)
        bad(file, str("truncated: tensor '", t.name, "' needs bytes ", header_.data_start + t.begin,
                      "..", header_.data_start + t.end, " but the file has ", file_size_));
    bad(file, str("file has ", file_size_ - header_.data_start - header_.data_size,
                  " bytes after the last tensor"));
  }
}

SafetensorsReader::~SafetensorsReader() = default;

void SafetensorsReader::read(const std::function<void*(const TensorInfo&)>& sink) {
  const std::string file = path_.string();
  NXD_CHECK_T(InternalError, !consumed_, "[safetensors] ", file, " read twice");
  consumed_ = true;
  std::vector<char> scratch;
  for (const auto& t : header_.tensors) {
    void* dst = sink(t);
    const size_t n = static_cast<size_t>(t.nbytes());
    if (!dst && !compressed_) {
      if (::lseek(src_->fd, static_cast<off_t>(n), SEEK_CUR) < 0)
        bad(file, str("seek past tensor '", t.name, "' failed"));
      continue;
    }
    void* into = dst;
    if (!dst) {
      scratch.resize(std::max(scratch.size(), n));
      into = scratch.data();
    }
    const size_t got = src_->read(into, n);
    if (got != n)
      bad(file, str(src_->error.empty() ? "truncated" : "unreadable (" + src_->error + ")",
                    ": tensor '", t.name, "' has ", got, " of its ", n, " bytes"));
    if (dst && t.crc) {
      const uint32_t c = crc32c(dst, n);
      if (c != *t.crc)
        bad(file, str("checksum mismatch in tensor '", t.name, "': stored ", crc_hex(*t.crc),
                      ", data has ", crc_hex(c)));
    }
  }
  if (compressed_) {
    char extra;
    const size_t more = src_->read(&extra, 1);
    if (!src_->error.empty()) bad(file, "unreadable after the last tensor (" + src_->error + ")");
    if (more != 0 || src_->frame_left != 0)
      bad(file, more ? "data after the last tensor" : "truncated: the zstd frame does not end");
    if (!src_->nothing_after_frame()) bad(file, "data after the zstd frame");
  }
}

std::vector<std::pair<std::string, Tensor>> SafetensorsReader::read_all() {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(header_.tensors.size());
  for (const auto& t : header_.tensors) out.emplace_back(t.name, empty(t.shape, t.dtype));
  size_t i = 0;
  read([&](const TensorInfo&) { return out[i++].second.raw_data(); });
  return out;
}

}  // namespace nxd::io
