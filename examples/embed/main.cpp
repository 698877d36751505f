// Builds a small tensor expression, takes its gradient, and checks it against the closed form.
#include <cmath>
#include <cstdio>

#include "nxd/autograd/ops.h"

int main() {
  using namespace nxd;
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  x.set_requires_grad(true);
  Tensor w = from_vector<float>({0.5f, -1, 2}, {3, 1});
  Tensor loss = sum(tanh(matmul(x, w)));  // sum_i tanh(x_i . w)
  backward(loss);
  // d loss / d x_ij = (1 - tanh^2(x_i . w)) * w_j
  double worst = 0;
  for (int i = 0; i < 2; ++i) {
    double z = 0;
    for (int j = 0; j < 3; ++j) z += x.at({i, j}) * w.at({j, 0});
    for (int j = 0; j < 3; ++j) {
      double expect = (1 - std::tanh(z) * std::tanh(z)) * w.at({j, 0});
      worst = std::fmax(worst, std::fabs(x.grad().at({i, j}) - expect));
    }
  }
  std::printf("loss %.6f, max gradient error %.3g\n", loss.item(), worst);
  return worst < 1e-5 ? 0 : 1;
}
