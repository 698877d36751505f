#include "nxd/optim/items.h"

#include <algorithm>

#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::optim {

namespace detail {

void for_each_item(const std::vector<int64_t>& sizes, int64_t cost,
                   const std::function<void(size_t, int64_t, int64_t)>& fn) {
  struct Item {
    size_t job;
    int64_t begin, end;
  };
  std::vector<Item> items;
  for (size_t j = 0; j < sizes.size(); ++j)
    for (int64_t b = 0; b < sizes[j]; b += kItem)
      items.push_back({j, b, std::min(sizes[j], b + kItem)});
  kernels::for_rows(static_cast<int64_t>(items.size()), kItem * cost, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) fn(items[i].job, items[i].begin, items[i].end);
  });
}

}  // namespace detail

}  // namespace nxd::optim
