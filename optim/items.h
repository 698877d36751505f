#pragma once
// The parallel element loop shared by the optimizers, ZeRO-1 and clipping (internal to nxd_optim):
// several tensors' element ranges run as one loop over the compute pool.
#include <cstdint>
#include <functional>
#include <vector>

namespace nxd::optim::detail {

// Elements per work item.
inline constexpr int64_t kItem = 16384;

// Job j covers [0, sizes[j]) and is cut into items of kItem elements; fn(j, begin, end) runs once
// per item, items spread over the compute pool (elementwise work: any split gives the same
// result). `cost` is the relative cost of one element.
void for_each_item(const std::vector<int64_t>& sizes, int64_t cost,
                   const std::function<void(size_t, int64_t, int64_t)>& fn);

}  // namespace nxd::optim::detail
