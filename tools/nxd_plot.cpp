// nxd-plot RUN [-o OUT.png] [--width PIXELS]
// Plots a run's metrics.csv (RUN is the file or the run folder holding it, e.g. runs/nxd_train):
// loss and val_loss against step in the upper panel, training tokens/s in the lower one, written
// as a PNG (default: metrics.png next to the CSV). Exit codes: 0 done, 2 a user mistake (missing
// or malformed file, no data; one line on stderr), 1 anything else.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "nxd/cli/exit.h"
#include "nxd/runtime/error.h"
#include "plot/chart.h"

namespace fs = std::filesystem;
using namespace nxd;
using namespace nxd::plot;

namespace {

const char* kUsage =
    "usage: nxd-plot RUN [-o OUT.png] [--width PIXELS]\n"
    "  RUN: a metrics.csv written by nxd-train, or the folder holding it\n"
    "Draws loss and val_loss, and tokens/s, against step (default output: metrics.png next to\n"
    "the CSV).\n";

// The columns of a metrics CSV by header name; an empty cell is NaN.
std::map<std::string, std::vector<double>> read_columns(const fs::path& csv) {
  std::ifstream in(csv);
  if (!in) throw IoError(str("cannot read '", csv.string(), "'"));
  std::string line;
  std::vector<std::string> names;
  if (!std::getline(in, line)) throw UserError(str("'", csv.string(), "' is empty"));
  for (std::stringstream ss(line); std::getline(ss, line, ',');) names.push_back(line);
  std::map<std::string, std::vector<double>> cols;
  for (int row = 2; std::getline(in, line); ++row) {
    std::stringstream ss(line);
    std::string cell;
    for (size_t i = 0; i < names.size(); ++i) {
      if (!std::getline(ss, cell, ',')) cell.clear();
      double v = std::numeric_limits<double>::quiet_NaN();
      if (!cell.empty()) {
        size_t used = 0;
        try {
          v = std::stod(cell, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != cell.size())
          throw UserError(str("'", csv.string(), "' line ", row, " column '", names[i],
                              "': not a number: '", cell, "'"));
      }
      cols[names[i]].push_back(v);
    }
  }
  for (const char* need : {"step", "loss"})
    if (!cols.count(need))
      throw UserError(
          str("'", csv.string(), "' has no column '", need, "' (is it an nxd-train metrics.csv?)"));
  if (cols["step"].empty()) throw UserError(str("'", csv.string(), "' has no rows"));
  return cols;
}

// The column `style.name` of `cols` against x (NaN where the CSV has no such column), drawn with
// style's color and markers.
Series series(const std::map<std::string, std::vector<double>>& cols, const std::vector<double>& x,
              Series style) {
  auto it = cols.find(style.name);
  style.x = x;
  style.y = it == cols.end() ? std::vector<double>(x.size(), NAN) : it->second;
  return style;
}

int run(const std::vector<std::string>& args) {
  std::string in, out;
  ChartOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UserError(str(args[i], " needs a value"));
      return args[++i];
    };
    if (args[i] == "-h" || args[i] == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (args[i] == "-o") {
      out = value();
    } else if (args[i] == "--width") {
      const std::string w = value();
      o.width = std::atoi(w.c_str());
      if (o.width < 320 || o.width > 8000) throw UserError(str("--width ", w, ": 320 to 8000"));
    } else if (in.empty() && args[i].rfind("-", 0) != 0) {
      in = args[i];
    } else {
      throw UserError(str("unknown argument '", args[i], "' (nxd-plot --help)"));
    }
  }
  if (in.empty()) throw UserError("no metrics given (nxd-plot --help)");
  fs::path csv = fs::is_directory(in) ? fs::path(in) / "metrics.csv" : fs::path(in);
  if (out.empty()) out = (csv.parent_path() / "metrics.png").string();
  auto cols = read_columns(csv);
  const auto& step = cols.at("step");
  std::vector<Panel> panels = {
      {"loss",
       {series(cols, step, {.name = "loss", .color = blue}),
        series(cols, step, {.name = "val_loss", .color = orange, .markers = true})}},
      {"training tokens/s", {series(cols, step, {.name = "tokens_per_s", .color = green})}}};
  write_png(out, render_chart(panels, o));
  std::printf("nxd-plot: wrote %s (%zu rows of %s)\n", out.c_str(), step.size(), csv.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return nxd::cli::run_main("nxd-plot",
                            [&] { return run(std::vector<std::string>(argv + 1, argv + argc)); });
}
