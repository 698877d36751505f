#pragma once
// The published nccom-test figures (Neuron SDK documentation, nccom-test page) that the collective
// cost model (collective_cost.h) is compared with, typed once for nxd-bench-collectives (which
// prints them next to the model) and the SimCost tests (which bound the model's error). Rows
// marked `calibration` set a machine constant in runtime/sim/machine.cpp (the per-rank busbw, the
// launch floor), so the model matches them by construction; the others are predictions.
// "GB/s" on that page is GiB/s.
#include "nxd/collectives/sim/collective_cost.h"

namespace nxd::sim {

struct NccomFigure {
  const char* what;
  const char* instance;  // machine() name
  int ranks;
  CollKind kind;
  double bytes;
  double us;  // published time per call
  const char* source;
  bool calibration;
  double test_tolerance;  // the test's bound on |model / published - 1|; 0: shown, not bounded
};

inline constexpr NccomFigure kNccomFigures[] = {
    {"2 ranks fp32 all-reduce (2023)", "trn1.32xlarge", 2, CollKind::all_reduce, 4 << 20, 107,
     "nccom-test.rst@4f641e78", false, 0},
    {"2 ranks fp32 all-reduce (2023)", "trn1.32xlarge", 2, CollKind::all_reduce, 16 << 20, 332,
     "nccom-test.rst@4f641e78", false, 0},
    {"2 ranks fp32 all-reduce (2023)", "trn1.32xlarge", 2, CollKind::all_reduce, 64 << 20, 1214,
     "nccom-test.rst@4f641e78", false, 0.05},
    {"2 ranks fp32 all-reduce (2023)", "trn1.32xlarge", 2, CollKind::all_reduce, 256 << 20, 4750,
     "nccom-test.rst@4f641e78", false, 0.05},
    {"2 ranks fp32 all-reduce (2023)", "trn1.32xlarge", 2, CollKind::all_reduce, 1 << 30, 18930,
     "nccom-test.rst@4f641e78", true, 0.05},
    {"64 ranks (2 x trn1.32xlarge) all-reduce", "2xtrn1.32xlarge", 64, CollKind::all_reduce,
     16 << 20, 2138, "nccom-test.rst@4f641e78", false, 0},
    {"64 ranks (2 x trn1.32xlarge) all-reduce", "2xtrn1.32xlarge", 64, CollKind::all_reduce,
     128 << 20, 6279, "nccom-test.rst@4f641e78", false, 0.20},
    {"64 ranks (2 x trn1.32xlarge) all-reduce", "2xtrn1.32xlarge", 64, CollKind::all_reduce,
     512 << 20, 21803, "nccom-test.rst@4f641e78", false, 0.20},
    {"64 ranks (2 x trn1.32xlarge) all-reduce", "2xtrn1.32xlarge", 64, CollKind::all_reduce,
     1 << 30, 41806, "nccom-test.rst@4f641e78", false, 0.20},
    {"32 ranks all-gather (newer SDK)", "trn1.32xlarge", 32, CollKind::all_gather, 1 << 10, 6.16,
     "nccom-test.rst@81ce03a", true, 0.25},
    {"32 ranks all-gather (newer SDK)", "trn1.32xlarge", 32, CollKind::all_gather, 512 << 10, 23.16,
     "nccom-test.rst@81ce03a", false, 0.25},
    {"8 ranks all-gather (--stats example)", "trn1.32xlarge", 8, CollKind::all_gather, 512 << 10,
     14.83, "nccom-test.rst@81ce03a", false, 0.25},
};

}  // namespace nxd::sim
