// What MATH on CUDA accepts: every dtype, mask kind and dropout; head dims up to 1024;
// flex score_mods and BlockMasks (programs interpreted per element,
// cuda/flex_interpreter.cuh), forward and backward, but no gradients of captured tensors.

#include <string>

#include "cuda/flex_device_program.h"
#include "cuda/math.h"
#include "sdpa/flex.h"

namespace sdpa::cuda {

bool math_supports(const AttentionParams& p, Reasons& r) {
  bool ok = true;
  if (p.head_dim_qk > kMathMaxHeadDim || p.head_dim_vo > kMathMaxHeadDim) {
    r.add("head_dim: MATH on CUDA takes E and Ev up to ", std::to_string(kMathMaxHeadDim),
          ", got E = ", std::to_string(p.head_dim_qk), ", Ev = ", std::to_string(p.head_dim_vo));
    ok = false;
  }
  // Biases arrive materialized (dense); only is_causal's band, in the sequence frame, is
  // native here.
  const MaskDescriptor& m = p.mask;
  bool native_ok = m.bands.size() <= 4 && !m.has_documents() && m.kv_lengths.empty() &&
                   m.alibi_slopes.empty();
  for (const DiagonalBand& band : m.bands) native_ok = native_ok && band.frame == BandFrame::kSequence;
  if (!native_ok) {
    r.add("mask: MATH on CUDA applies up to 4 sequence-frame bands natively; other native "
          "mask parts must come materialized");
    ok = false;
  }
  if (p.dropout.positioned()) {
    r.add("dropout_position: MATH on CUDA draws dropout for whole calls only in this build");
    ok = false;
  }
  if (p.mask.score_mod || p.mask.block_mask) {
    const flex::BlockMask* blocks = p.mask.block_mask.get();
    std::string why;
    if (p.mask.score_mod) why = interpreter_unsupported(*p.mask.score_mod);
    if (why.empty() && p.backward && p.mask.score_mod) {
      for (const flex::Captured& c : p.mask.score_mod->captured()) {
        if (c.requires_grad()) {
          why = "captured tensor '" + c.name() +
                "' requires grad; MATH on CUDA returns no "
                "gradients of captured tensors (the CPU does)";
          break;
        }
      }
    }
    if (why.empty() && blocks != nullptr && blocks->mask_mod) {
      why = interpreter_unsupported(*blocks->mask_mod);
    }
    if (!why.empty()) {
      r.add("flex: " + why);
      ok = false;
    }
  }
  return ok;
}

}  // namespace sdpa::cuda
