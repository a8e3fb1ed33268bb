// Runs one attention call through the installed library and checks a value by hand:
// with one key, every query's output is that key's value row.
#include <cmath>
#include <cstdio>

#include "sdpa/sdpa.h"

int main() {
  sdpa::Tensor q = sdpa::Tensor::full({1, 2, 3, 4}, 0.5, sdpa::DType::kFloat32);
  sdpa::Tensor k = sdpa::Tensor::full({1, 2, 1, 4}, -1.0, sdpa::DType::kFloat32);
  sdpa::Tensor v = sdpa::Tensor::full({1, 2, 1, 5}, 2.5, sdpa::DType::kFloat32);
  const sdpa::Tensor out = sdpa::scaled_dot_product_attention(q, k, v);
  const double x = out.item({0, 1, 2, 4});
  std::printf("sdpa %s: out[0, 1, 2, 4] = %g\n", sdpa::version().c_str(), x);
  return std::fabs(x - 2.5) < 1e-6 ? 0 : 1;
}
