// A BlockMask's band on cuDNN (block_mask_band.h).

#include "cudnn/block_mask_band.h"

#include <cmath>
#include <memory>

#include "flex/mask_band.h"

namespace sdpa::cudnn {

namespace {

// The verdict on a BlockMask alone (its lists, mask_mod and lengths): the band, or why
// cuDNN cannot run it.
std::optional<DiagonalBand> band_verdict(const flex::BlockMask& blocks, const char*& why) {
  if (!blocks.mask_mod) {
    why = "flex: cuDNN takes a BlockMask through its mask_mod; this one has only block lists";
    return std::nullopt;
  }
  std::optional<DiagonalBand> band = flex::band_of_mask_mod(*blocks.mask_mod);
  if (!band) {
    why = "flex: cuDNN takes a BlockMask whose mask_mod is a band of q_idx - kv_idx (causal, "
          "sliding window); this mask_mod is not one";
    return std::nullopt;
  }
  if (!flex::block_lists_follow_band(blocks, *band)) {
    why = "flex: the BlockMask's block lists do not follow its mask_mod (a block of the band "
          "is missing or a full block leaves it); cuDNN cannot run the lists";
    return std::nullopt;
  }
  // Row q keeps keys [q - left, q + right] within [0, kv_len): some key for every row
  // exactly when the first row reaches key 0, the last row key kv_len - 1 and the band
  // is not inverted.
  const bool empty_rows =
      (band->right && *band->right < 0) ||
      (band->left && blocks.q_len - 1 - *band->left > blocks.kv_len - 1) ||
      (band->left && band->right && *band->left + *band->right < 0) || blocks.kv_len == 0;
  if (empty_rows) {
    why = "flex: the BlockMask's band leaves query rows without keys (zeros by sdpa's rule); "
          "cuDNN is not asked to give them";
    return std::nullopt;
  }
  return band;
}

}  // namespace

std::optional<DiagonalBand> block_mask_band(const AttentionParams& p, Reasons& r) {
  // Selection and the kernel ask about one call's BlockMask, which params hold immutable:
  // the thread's last verdict is reused, as checking the lists takes a pass over every
  // block (about a millisecond at L = 131072). Keyed by the BlockMask's owner, not its
  // address: while the weak_ptr lives, no other BlockMask can have this owner.
  struct Last {
    std::weak_ptr<const flex::BlockMask> blocks;
    std::optional<DiagonalBand> band;
    const char* why = nullptr;
  };
  thread_local Last last;
  const std::shared_ptr<const flex::BlockMask>& blocks = p.mask.block_mask;
  if (last.blocks.owner_before(blocks) || blocks.owner_before(last.blocks)) {
    last.why = nullptr;
    last.band = band_verdict(*blocks, last.why);
    last.blocks = blocks;
  }
  if (!last.band) r.add(last.why);
  return last.band;
}

std::shared_ptr<const flex::Program> banded_score_mod(
    const std::shared_ptr<const flex::Program>& score_mod, const DiagonalBand& band) {
  struct Last {
    std::shared_ptr<const flex::Program> score_mod;
    std::optional<int64_t> left, right;
    std::shared_ptr<const flex::Program> program;
  };
  thread_local Last last;
  if (last.program != nullptr && last.score_mod == score_mod && last.left == band.left &&
      last.right == band.right) {
    return last.program;
  }
  const flex::Expr inner = score_mod->root();
  const auto mod = [&](const flex::Expr&, const flex::Expr&, const flex::Expr&,
                       const flex::Expr& q, const flex::Expr& kv) {
    std::optional<flex::Expr> keep;
    const auto both = [&keep](const flex::Expr& e) { keep = keep ? *keep && e : e; };
    if (band.left) both(kv >= q - flex::Expr(*band.left));
    if (band.right) both(kv <= q + flex::Expr(*band.right));
    return keep ? flex::where(*keep, inner, flex::Expr(-INFINITY)) : inner;
  };
  last = {score_mod, band.left, band.right,
          std::make_shared<const flex::Program>(flex::Program::from_score_mod(mod))};
  return last.program;
}

}  // namespace sdpa::cudnn
