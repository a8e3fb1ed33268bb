// Diagonal bands of mask_mods (mask_band.h): an abstract evaluation of the program in
// which integers are affine in (q_idx, kv_idx) and bools are intervals of d = q_idx - kv_idx.

#include "flex/mask_band.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "flex/node.h"

namespace sdpa::flex {
namespace {

// a * q_idx + c * kv_idx + k, or unknown (anything else: b, h, captured reads, products).
struct Affine {
  bool known = false;
  int64_t a = 0, c = 0, k = 0;
};

// Constants and coefficients beyond these are not folded (the value becomes unknown):
// sums and products of two stay far from int64's range.
constexpr double kMaxConstant = 4.0e15;
constexpr int64_t kMaxCoefficient = int64_t{1} << 20;

// The set of d = q_idx - kv_idx a bool keeps: the integers in [lo, hi] (an absent bound is
// unbounded), none (`empty`), or unknown.
struct DSet {
  bool known = false;
  bool empty = false;
  std::optional<int64_t> lo, hi;
};

DSet all() { return {true, false, std::nullopt, std::nullopt}; }
DSet none() { return {true, true, std::nullopt, std::nullopt}; }

DSet interval(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) return none();
  return {true, false, lo, hi};
}

DSet intersect(const DSet& x, const DSet& y) {
  if (!x.known || !y.known) return {};
  if (x.empty || y.empty) return none();
  const auto tighter = [](std::optional<int64_t> u, std::optional<int64_t> v, bool upper) {
    if (!u) return v;
    if (!v) return u;
    return upper ? std::min(u, v) : std::max(u, v);
  };
  return interval(tighter(x.lo, y.lo, false), tighter(x.hi, y.hi, true));
}

// The union when it is one interval (the two overlap or touch), else unknown.
DSet unite(const DSet& x, const DSet& y) {
  if (!x.known || !y.known) return {};
  if (x.empty) return y;
  if (y.empty) return x;
  // Order by lower bound (absent first); they join unless a gap lies between them.
  const bool x_first = !x.lo || (y.lo && *x.lo <= *y.lo);
  const DSet& first = x_first ? x : y;
  const DSet& second = x_first ? y : x;
  if (first.hi && second.lo && *second.lo > *first.hi + 1) return {};
  const std::optional<int64_t> hi =
      !first.hi || !second.hi ? std::nullopt : std::optional(std::max(*first.hi, *second.hi));
  return interval(first.lo, hi);
}

// The complement when it is one interval (x is one-sided, everything or nothing).
DSet complement(const DSet& x) {
  if (!x.known) return {};
  if (x.empty) return all();
  if (!x.lo && !x.hi) return none();
  if (x.lo && x.hi) return {};
  if (x.lo) return interval(std::nullopt, *x.lo - 1);
  return interval(*x.hi + 1, std::nullopt);
}

// The d that `diff` (an affine value) compared with 0 by `op` keeps.
DSet compare(Op op, const Affine& diff) {
  if (!diff.known) return {};
  const int64_t k = diff.k;
  if (diff.a == 0 && diff.c == 0) {
    const bool keep = op == Op::kLt ? k < 0 : op == Op::kLe ? k <= 0 : op == Op::kGt ? k > 0
                    : op == Op::kGe ? k >= 0 : op == Op::kEq ? k == 0 : k != 0;
    return keep ? all() : none();
  }
  // diff = s * d + k with d = q_idx - kv_idx and s = +1 or -1.
  if (diff.c != -diff.a || (diff.a != 1 && diff.a != -1)) return {};
  const int64_t s = diff.a;
  // s d + k >= m  <=>  d >= m - k (s = 1) or d <= k - m (s = -1); likewise for <=.
  const auto at_least = [&](int64_t m) {
    return s == 1 ? interval(m - k, std::nullopt) : interval(std::nullopt, k - m);
  };
  const auto at_most = [&](int64_t m) {
    return s == 1 ? interval(std::nullopt, m - k) : interval(k - m, std::nullopt);
  };
  switch (op) {
    case Op::kGe: return at_least(0);
    case Op::kGt: return at_least(1);
    case Op::kLe: return at_most(0);
    case Op::kLt: return at_most(-1);
    case Op::kEq: return intersect(at_least(0), at_most(0));
    default: return {};  // != keeps two rays
  }
}

// An affine value within the folding bounds, else unknown.
Affine bounded(int64_t a, int64_t c, int64_t k) {
  if (std::abs(a) > kMaxCoefficient || std::abs(c) > kMaxCoefficient ||
      std::abs(static_cast<double>(k)) > kMaxConstant) {
    return {};
  }
  return {true, a, c, k};
}

Affine combine(const Affine& x, const Affine& y, int64_t sign) {
  if (!x.known || !y.known) return {};
  return bounded(x.a + sign * y.a, x.c + sign * y.c, x.k + sign * y.k);
}

Affine scaled(const Affine& x, const Affine& factor) {
  if (!x.known || !factor.known || factor.a != 0 || factor.c != 0) return {};
  if (std::abs(factor.k) > kMaxCoefficient ||
      std::abs(static_cast<double>(x.k) * static_cast<double>(factor.k)) > kMaxConstant) {
    return {};
  }
  return bounded(x.a * factor.k, x.c * factor.k, x.k * factor.k);
}

}  // namespace

std::optional<DiagonalBand> band_of_mask_mod(const Program& mask_mod) {
  const CompiledProgram& code = *mask_mod.compiled();
  if (!code.is_mask || code.result < 0) return std::nullopt;
  std::vector<Affine> ints(code.code.size());
  std::vector<DSet> bools(code.code.size());
  for (size_t i = 0; i < code.code.size(); ++i) {
    const Instr& in = code.code[i];
    const auto arg = [&](int n) { return static_cast<size_t>(in.args[static_cast<size_t>(n)]); };
    switch (in.op) {
      case Op::kQIdx: ints[i] = {true, 1, 0, 0}; break;
      case Op::kKvIdx: ints[i] = {true, 0, 1, 0}; break;
      case Op::kConst:
        if (in.type == ValueType::kBool) {
          bools[i] = in.constant != 0.0 ? all() : none();
        } else if (in.type == ValueType::kInt && std::abs(in.constant) <= kMaxConstant) {
          ints[i] = {true, 0, 0, static_cast<int64_t>(in.constant)};
        }
        break;
      case Op::kAdd: ints[i] = combine(ints[arg(0)], ints[arg(1)], 1); break;
      case Op::kSub: ints[i] = combine(ints[arg(0)], ints[arg(1)], -1); break;
      case Op::kNeg: ints[i] = combine({true, 0, 0, 0}, ints[arg(0)], -1); break;
      case Op::kMul:
        ints[i] = ints[arg(0)].known && ints[arg(0)].a == 0 && ints[arg(0)].c == 0
                      ? scaled(ints[arg(1)], ints[arg(0)])
                      : scaled(ints[arg(0)], ints[arg(1)]);
        break;
      case Op::kLt: case Op::kLe: case Op::kGt: case Op::kGe: case Op::kEq: case Op::kNe:
        if (code.code[arg(0)].type == ValueType::kInt && code.code[arg(1)].type == ValueType::kInt) {
          bools[i] = compare(in.op, combine(ints[arg(0)], ints[arg(1)], -1));
        }
        break;
      case Op::kAnd: bools[i] = intersect(bools[arg(0)], bools[arg(1)]); break;
      case Op::kOr: bools[i] = unite(bools[arg(0)], bools[arg(1)]); break;
      case Op::kNot: bools[i] = complement(bools[arg(0)]); break;
      default: break;  // b, h, captured reads, floats, bit operations: unknown
    }
    if (in.type != ValueType::kInt) ints[i] = {};
    if (in.type != ValueType::kBool) bools[i] = {};
  }
  const DSet& kept = bools[static_cast<size_t>(code.result)];
  if (!kept.known || kept.empty) return std::nullopt;
  DiagonalBand band;
  band.left = kept.hi;
  if (kept.lo) band.right = -*kept.lo;
  return band;
}

bool block_lists_follow_band(const BlockMask& blocks, const DiagonalBand& band) {
  const int64_t nq = blocks.num_q_blocks(), nkv = blocks.num_kv_blocks();
  const int64_t qbs = blocks.q_block_size, kbs = blocks.kv_block_size;
  // The band's d = q_idx - kv_idx in [lo, hi]; an absent bound lies beyond any block's d.
  constexpr int64_t kFar = int64_t{1} << 62;
  const int64_t lo = band.right ? -*band.right : -kFar;
  const int64_t hi = band.left ? *band.left : kFar;
  const bool has_full = blocks.full_kv_num_blocks.defined();
  // 0 unlisted, 1 partial, 2 full: one q block's statuses.
  std::vector<uint8_t> status(static_cast<size_t>(nkv));
  for (int64_t row = 0; row < blocks.batch * blocks.num_heads * nq; ++row) {
    std::fill(status.begin(), status.end(), uint8_t{0});
    const int32_t* partial = blocks.kv_indices.data<int32_t>() + row * nkv;
    for (int32_t n = 0; n < blocks.kv_num_blocks.data<int32_t>()[row]; ++n) status[partial[n]] = 1;
    if (has_full) {
      const int32_t* full = blocks.full_kv_indices.data<int32_t>() + row * nkv;
      for (int32_t n = 0; n < blocks.full_kv_num_blocks.data<int32_t>()[row]; ++n) {
        status[full[n]] = 2;
      }
    }
    const int64_t q0 = row % nq * qbs, q1 = std::min(blocks.q_len, q0 + qbs);
    for (int64_t j = 0; j < nkv; ++j) {
      const int64_t k0 = j * kbs, k1 = std::min(blocks.kv_len, k0 + kbs);
      // d = q_idx - kv_idx over the block takes every integer in [d_min, d_max].
      const int64_t d_min = q0 - (k1 - 1), d_max = (q1 - 1) - k0;
      const bool meets = d_max >= lo && d_min <= hi;
      const bool inside = d_min >= lo && d_max <= hi;
      const uint8_t s = status[static_cast<size_t>(j)];
      if ((meets && s == 0) || (s == 2 && !inside)) return false;
    }
  }
  return true;
}

}  // namespace sdpa::flex
