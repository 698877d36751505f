#pragma once
// CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected: 0x82F63B78), the checksum stored for every
// tensor of a checkpoint. crc32c("123456789") == 0xE3069283 (RFC 3720's check value). Uses the
// SSE4.2 crc32 instruction when the build targets it (three interleaved streams), else a
// slicing-by-8 table.
#include <cstddef>
#include <cstdint>
#include <string>

namespace nxd::io {

// Continues `crc` (0 to start) over n bytes.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The table-driven form (what crc32c uses without SSE4.2), for tests.
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);
// "e3069283": 8 lowercase hex digits.
std::string crc_hex(uint32_t crc);
// Parses crc_hex's form; false if `s` is not 8 hex digits.
bool parse_crc_hex(const std::string& s, uint32_t* out);

}  // namespace nxd::io
