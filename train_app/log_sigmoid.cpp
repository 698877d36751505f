#include "nxd/train_app/log_sigmoid.h"

#include "nxd/autograd/function.h"
#include "nxd/autograd/ops.h"

namespace nxd::train_app {

Tensor log_sigmoid(const Tensor& x) {
  return autograd::custom(
             "log_sigmoid", {x},
             [](const std::vector<Tensor>& in) {
               const Tensor& v = in[0];
               return std::vector<Tensor>{neg(add(relu(neg(v)), log(add(exp(neg(abs(v))), 1.0))))};
             },
             [x = x.detach()](const Grads& g) { return Grads{mul(g[0], sigmoid(neg(x)))}; })
      .at(0);
}

}  // namespace nxd::train_app
