#pragma once
// Native mask parts the GPU backends run without a dense mask (ALiBi, packed documents,
// key padding, with bands beside them), shared by the cuDNN and CUDA FLASH tests; the CPU
// MATH golden computes each of them natively.

#include <memory>
#include <string>
#include <vector>

#include "sdpa/attn_bias.h"

namespace sdpa_test {

struct NativeMaskCase {
  std::string name;
  int64_t q_len, kv_len;
  sdpa::AttnBiasPtr bias;
};

/// The cases for `heads_q` query heads (ALiBi slopes 0.3 / (h + 1)).
inline std::vector<NativeMaskCase> native_mask_cases(int64_t heads_q) {
  using sdpa::DiagonalAlignment;
  std::vector<float> slopes;
  for (int64_t h = 0; h < heads_q; ++h) slopes.push_back(0.3f / static_cast<float>(h + 1));
  const auto alibi = [&](DiagonalAlignment a) {
    return std::make_shared<sdpa::AlibiBias>(slopes, a);
  };
  return {
      {"alibi", 65, 129, alibi(DiagonalAlignment::kBottomRight)},
      {"alibi + causal", 127, 127,
       sdpa::compose({alibi(DiagonalAlignment::kBottomRight), sdpa::causal_upper_left(127, 127)})},
      {"alibi + causal, L > S", 129, 65,
       sdpa::compose({alibi(DiagonalAlignment::kTopLeft), sdpa::causal_upper_left(129, 65)})},
      {"documents, causal inside", 100, 100,
       std::make_shared<sdpa::BlockDiagonalBias>(std::vector<int64_t>{0, 7, 64, 100},
                                                 std::vector<int64_t>{}, true)},
      {"documents of other key lengths", 63, 130,
       std::make_shared<sdpa::BlockDiagonalBias>(std::vector<int64_t>{0, 30, 63},
                                                 std::vector<int64_t>{0, 65, 130})},
      {"padded keys, causal", 7, 257,
       std::make_shared<sdpa::PaddedKeysBias>(std::vector<int64_t>{257, 100}, true)},
      {"padded keys + alibi", 65, 200,
       sdpa::compose({std::make_shared<sdpa::PaddedKeysBias>(std::vector<int64_t>{120, 200}),
                      alibi(DiagonalAlignment::kBottomRight)})},
  };
}

}  // namespace sdpa_test
