#pragma once
// Byte mutations for the fuzz targets' replay tests (every build drives each fuzz target over
// deterministic mutations of valid files).
#include <algorithm>
#include <random>
#include <string>

namespace nxd::testing {

// 1 to 4 random edits: bit flips, byte changes, truncations, insertions, the first 8 bytes,
// erasures.
inline void mutate_bytes(std::string& s, std::mt19937_64& g) {
  const int edits = 1 + static_cast<int>(g() % 4);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t at = g() % s.size();
    switch (g() % 6) {
      case 0:
        s[at] = static_cast<char>(s[at] ^ (1 << (g() % 8)));
        break;
      case 1:
        s[at] = static_cast<char>(g());
        break;
      case 2:
        s.resize(at);
        break;
      case 3:
        s.insert(at, 1 + g() % 9, static_cast<char>(g()));
        break;
      case 4:  // the length prefix (plain files)
        s[g() % std::min<size_t>(8, s.size())] = static_cast<char>(g());
        break;
      default:
        s.erase(at, 1 + g() % 16);
    }
  }
}

}  // namespace nxd::testing
