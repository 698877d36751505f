#pragma once
// Byte mutations for the fuzz targets' replay tests (every build drives each fuzz target over
// deterministic mutations of valid files).
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
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

// One structural edit of a JSON tree: a random path (at most 6 deep) from the root to a value,
// which is erased (below the root) or replaced by a hostile value: small and negative integers,
// 2^40..2^62, a fraction, a huge float, a string, null, a list, an empty object.
inline void mutate_json_tree(nlohmann::json& j, std::mt19937_64& g) {
  nlohmann::json* at = &j;
  for (int depth = 0; depth < 6 && (at->is_object() || at->is_array()) && !at->empty(); ++depth) {
    auto it = at->begin();
    std::advance(it, static_cast<long>(g() % at->size()));
    if (g() % 3 == 0 && depth > 0) {
      if (at->is_object())
        at->erase(it.key());
      else
        at->erase(g() % at->size());
      return;
    }
    at = &*it;
  }
  switch (g() % 10) {
    case 0:
      *at = static_cast<int64_t>(g() % 200) - 100;
      break;
    case 1:
      *at = -1;
      break;
    case 2:
      *at = "linear";
      break;
    case 3:
      *at = nlohmann::json::array({g() % 7, -3});
      break;
    case 4:
      *at = int64_t{1} << (40 + g() % 23);
      break;
    case 5:
      *at = 64.5;
      break;
    case 6:
      *at = 1e300;
      break;
    case 7:
      *at = nullptr;
      break;
    case 8:
      *at = nlohmann::json::object();
      break;
    default:
      *at = 0;
  }
}

}  // namespace nxd::testing
