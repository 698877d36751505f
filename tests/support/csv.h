#pragma once
// A CSV file as the tests read the metrics the trainer writes: the header line and the rows split
// at commas (no quoting; an empty last column is kept).
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace nxd::testing {

struct Csv {
  std::string header;
  std::vector<std::vector<std::string>> rows;  // without the header
};

inline Csv read_csv(const std::filesystem::path& p) {
  Csv c;
  std::ifstream in(p);
  std::getline(in, c.header);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    std::stringstream ss(line);
    std::string col;
    while (std::getline(ss, col, ',')) cols.push_back(col);
    if (!line.empty() && line.back() == ',') cols.push_back("");
    c.rows.push_back(cols);
  }
  return c;
}

}  // namespace nxd::testing
