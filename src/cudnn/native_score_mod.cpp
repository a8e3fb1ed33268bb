// Native mask parts as a score_mod program (native_score_mod.h).

#include "cudnn/native_score_mod.h"

#include "cuda/row_intervals.h"

#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

namespace sdpa::cudnn {
namespace {

using cuda::RowIntervals;
using cuda::needs_intervals;
using cuda::row_intervals;
using flex::Expr;

// The diagonal offset d of an alignment (MaskDescriptor): 0 top-left, S - L bottom-right.
int64_t offset(DiagonalAlignment alignment, const AttentionParams& p) {
  return alignment == DiagonalAlignment::kBottomRight ? p.kv_len - p.q_len : 0;
}

// int32 [rows, cols], or [cols] for one row (read by q_idx alone).
Tensor int32_tensor(const std::vector<int32_t>& values, int64_t rows, int64_t cols) {
  Tensor t = rows == 1 ? Tensor::empty({cols}, DType::kInt32)
                       : Tensor::empty({rows, cols}, DType::kInt32);
  std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

std::shared_ptr<const flex::Program> trace(const AttentionParams& p, const RowIntervals& rows) {
  const MaskDescriptor& m = p.mask;
  std::optional<flex::Captured> slopes, lo, hi;
  if (!m.alibi_slopes.empty()) {
    Tensor t = Tensor::empty({static_cast<int64_t>(m.alibi_slopes.size())}, DType::kFloat32);
    std::memcpy(t.data_ptr(), m.alibi_slopes.data(), m.alibi_slopes.size() * sizeof(float));
    slopes.emplace("alibi_slopes", t);
  }
  if (needs_intervals(m)) {
    lo.emplace("first_key", int32_tensor(rows.lo, rows.batches, p.q_len));
    hi.emplace("end_key", int32_tensor(rows.hi, rows.batches, p.q_len));
  }
  const auto mod = [&](const Expr& score, const Expr& b, const Expr& h, const Expr& q,
                       const Expr& kv) {
    Expr out = score;
    if (slopes) {
      const Expr distance = flex::abs(q + Expr(offset(m.alibi_alignment, p)) - kv);
      out = out - Expr((*slopes)[h]) * flex::to_float(distance);
    }
    std::optional<Expr> keep;
    const auto both = [&keep](const Expr& e) { keep = keep ? *keep && e : e; };
    if (lo) {
      const auto at = [&](const flex::Captured& t) {
        return rows.batches > 1 ? Expr(t[b][q]) : Expr(t[q]);
      };
      both(kv >= at(*lo));
      both(kv < at(*hi));
    } else {
      for (const DiagonalBand& band : m.bands) {
        const int64_t d = offset(band.alignment, p);
        if (band.left) both(kv >= q + Expr(d - *band.left));
        if (band.right) both(kv <= q + Expr(d + *band.right));
      }
    }
    return keep ? flex::where(*keep, out, Expr(-INFINITY)) : out;
  };
  return std::make_shared<const flex::Program>(flex::Program::from_score_mod(mod));
}

}  // namespace

bool needs_native_score_mod(const MaskDescriptor& m) {
  return !m.score_mod && !m.block_mask &&
         (!m.alibi_slopes.empty() || !m.kv_lengths.empty() || m.has_documents());
}

std::shared_ptr<const flex::Program> native_score_mod(const AttentionParams& p, Reasons& r) {
  const MaskDescriptor& m = p.mask;
  // Selection and the kernel ask for the same call's program in turn (and a model repeats
  // it): the thread's last answer is reused when everything it came from matches.
  struct Key {
    std::vector<float> slopes;
    DiagonalAlignment alignment;
    std::vector<std::array<int64_t, 6>> bands;  // alignment, frame, has left, left, has right, right
    std::vector<int64_t> kv_lengths, cu_q, cu_kv;
    int64_t batch, q_len, kv_len;
    bool operator==(const Key&) const = default;
  };
  Key key{m.alibi_slopes, m.alibi_alignment, {}, m.kv_lengths, m.cu_seqlens_q, m.cu_seqlens_kv,
          p.batch, p.q_len, p.kv_len};
  for (const DiagonalBand& b : m.bands) {
    key.bands.push_back({static_cast<int64_t>(b.alignment), static_cast<int64_t>(b.frame),
                         b.left.has_value(), b.left.value_or(0), b.right.has_value(),
                         b.right.value_or(0)});
  }
  struct Last {
    Key key;
    bool every_row_keeps_a_key = false;
    std::shared_ptr<const flex::Program> program;
  };
  thread_local Last last;
  if (last.program == nullptr || !(last.key == key)) {
    const RowIntervals rows = row_intervals(p);
    last = {std::move(key), rows.every_row_keeps_a_key, trace(p, rows)};
  }
  if (!last.every_row_keeps_a_key) {
    r.add("mask: some query rows keep no key (zeros by sdpa's rule); cuDNN is not used for "
          "them");
    return nullptr;
  }
  return last.program;
}

}  // namespace sdpa::cudnn
