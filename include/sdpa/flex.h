#pragma once
// Flex attention: score_mod / mask_mod written as ordinary C++ lambdas over placeholder
// expressions, traced once into a small typed program that the fused kernels evaluate
// over whole tile rows, differentiate symbolically and bound by interval analysis.
// Semantics follow PyTorch's torch.nn.attention.flex_attention.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sdpa/tensor.h"

namespace sdpa {

struct AttentionResult;
struct AttentionGradients;
struct SDPAOptions;

namespace flex {

/// Value type of an expression: float (computed in float32 by FLASH, float64 by MATH),
/// integer (int64 semantics; indices) or bool.
enum class ValueType : uint8_t { kFloat, kInt, kBool };

struct Node;

/// A traced expression. Built from the placeholders handed to a mod, constants, captured
/// tensor reads and the operators below; never evaluated eagerly.
class Expr {
 public:
  Expr(double value);   // NOLINT(google-explicit-constructor): float constant
  Expr(float value);    // NOLINT
  Expr(int value);      // NOLINT: integer constant
  Expr(int64_t value);  // NOLINT
  Expr(bool value);     // NOLINT
  explicit Expr(std::shared_ptr<const Node> node) : node_(std::move(node)) {}

  ValueType type() const;
  const std::shared_ptr<const Node>& node() const { return node_; }

 private:
  std::shared_ptr<const Node> node_;
};

// Arithmetic: int op int stays int (except / which is true division, as torch); any float
// operand makes the result float. Comparisons give bool; !, &&, || take bool; &, |, ^ and
// ~ are logical on bools and bitwise (two's complement) on ints, as torch's.
Expr operator+(const Expr& a, const Expr& b);
Expr operator-(const Expr& a, const Expr& b);
Expr operator*(const Expr& a, const Expr& b);
Expr operator/(const Expr& a, const Expr& b);
/// Floor modulo of integers (Python / torch semantics: the sign follows the divisor).
Expr operator%(const Expr& a, const Expr& b);
Expr operator-(const Expr& a);
Expr operator<(const Expr& a, const Expr& b);
Expr operator<=(const Expr& a, const Expr& b);
Expr operator>(const Expr& a, const Expr& b);
Expr operator>=(const Expr& a, const Expr& b);
Expr operator==(const Expr& a, const Expr& b);
Expr operator!=(const Expr& a, const Expr& b);
Expr operator&(const Expr& a, const Expr& b);
Expr operator|(const Expr& a, const Expr& b);
Expr operator&&(const Expr& a, const Expr& b);
Expr operator||(const Expr& a, const Expr& b);
Expr operator!(const Expr& a);
Expr operator~(const Expr& a);
Expr operator^(const Expr& a, const Expr& b);
/// Shifts of ints (torch.bitwise_left_shift / right_shift; >> is arithmetic). A shift count
/// outside [0, 63] gives 0 (<<) or the sign fill (>>), as torch and numpy do.
Expr operator<<(const Expr& a, const Expr& b);
Expr operator>>(const Expr& a, const Expr& b);
/// Floor division of integers (torch's //).
Expr floor_div(const Expr& a, const Expr& b);
/// cond ? a : b elementwise (torch.where).
Expr where(const Expr& cond, const Expr& a, const Expr& b);
Expr minimum(const Expr& a, const Expr& b);
Expr maximum(const Expr& a, const Expr& b);
Expr abs(const Expr& a);
Expr exp(const Expr& a);
Expr log(const Expr& a);
Expr tanh(const Expr& a);
Expr sigmoid(const Expr& a);
Expr sqrt(const Expr& a);
Expr sin(const Expr& a);
Expr cos(const Expr& a);
/// Rounding of floats toward -inf / +inf (float result, as torch.floor); ints unchanged.
Expr floor(const Expr& a);
Expr ceil(const Expr& a);
/// Converts an int or bool expression to float.
Expr to_float(const Expr& a);

/// A tensor captured by a mod (a table of slopes, document ids, a learnable bias...).
/// Reads are bounds-checked: an index outside the tensor raises sdpa::Error naming the
/// tensor, the index and the (b, h, q_idx, kv_idx) that produced it. Float tensors read as
/// float, int32/int64 as int, bool as bool. The program depends on the tensor's shape and
/// dtype, not its values.
class Captured {
 public:
  /// `name` appears in errors and printouts. `requires_grad` (float tensors only) makes
  /// flex_attention_backward return d(loss)/d(tensor).
  Captured(std::string name, Tensor tensor, bool requires_grad = false);
  /// Shares an existing capture (the same tensor identity across programs).
  explicit Captured(std::shared_ptr<const struct CapturedData> data) : data_(std::move(data)) {}

  /// Partial index t[i][j]...; converts to Expr once every dimension is indexed.
  class Index {
   public:
    Index operator[](const Expr& index) const;
    operator Expr() const;  // NOLINT(google-explicit-constructor)

   private:
    friend class Captured;
    Index(std::shared_ptr<const struct CapturedData> data, std::vector<Expr> indices)
        : data_(std::move(data)), indices_(std::move(indices)) {}
    std::shared_ptr<const struct CapturedData> data_;
    std::vector<Expr> indices_;
  };
  Index operator[](const Expr& index) const;
  /// t(i, j, ...): all indices at once.
  Expr operator()(const std::vector<Expr>& indices) const;

  const std::string& name() const;
  const Tensor& tensor() const;
  bool requires_grad() const;
  const std::shared_ptr<const struct CapturedData>& data() const { return data_; }

 private:
  std::shared_ptr<const struct CapturedData> data_;
};

/// score_mod(score, b, h, q_idx, kv_idx) -> new score (FlexAttention's signature).
using ScoreMod = std::function<Expr(const Expr& score, const Expr& b, const Expr& h,
                                    const Expr& q_idx, const Expr& kv_idx)>;
/// mask_mod(b, h, q_idx, kv_idx) -> bool: true = the key takes part.
using MaskMod =
    std::function<Expr(const Expr& b, const Expr& h, const Expr& q_idx, const Expr& kv_idx)>;

struct CompiledProgram;

/// A traced, type-checked program: straight-line instructions in SSA form over the inputs
/// score, b, h, q_idx, kv_idx. Hashed structurally (captured tensors by shape and dtype,
/// not values); compiled forms are cached by that hash.
class Program {
 public:
  /// Traces a score_mod (result must be float). Throws sdpa::Error for type errors.
  static Program from_score_mod(const ScoreMod& mod);
  /// Traces a mask_mod (result must be bool). Throws sdpa::Error for type errors.
  static Program from_mask_mod(const MaskMod& mod);
  /// Wraps a traced root expression; `is_mask` selects the expected result type.
  static Program from_expr(const Expr& root, bool is_mask);

  bool is_mask() const;
  /// Whether the result depends on the score input.
  bool uses_score() const;
  uint64_t structural_hash() const;
  /// One instruction per line: "%3 = sub q_idx kv_idx".
  std::string to_string() const;
  const std::vector<Captured>& captured() const;
  const std::shared_ptr<const CompiledProgram>& compiled() const { return compiled_; }

  /// The traced expression (for automatic differentiation).
  Expr root() const { return Expr(root_); }

  /// Reference evaluation in float64 (the oracle for kernels and tests). Throws
  /// sdpa::Error for out-of-range captured reads.
  double evaluate(double score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) const;

 private:
  std::shared_ptr<const CompiledProgram> compiled_;
  std::vector<Captured> captured_;
  std::shared_ptr<const Node> root_;
};

/// Block sparsity of a mask_mod at BLOCK_SIZE granularity (FlexAttention's BlockMask):
/// for each (b, h, q block), the kv blocks that are partial (mask_mod must be evaluated)
/// and full (every element kept: mask_mod skipped), plus the q-side transposes used by the
/// backward. Blocks in neither list are empty and never computed.
struct BlockMask {
  int64_t batch = 0, num_heads = 0, q_len = 0, kv_len = 0;
  int64_t q_block_size = 128, kv_block_size = 128;
  /// int32 [B, H, num_q_blocks] and [B, H, num_q_blocks, num_kv_blocks] (first
  /// kv_num_blocks entries valid, ascending).
  Tensor kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices;
  /// Transposes: int32 [B, H, num_kv_blocks] and [B, H, num_kv_blocks, num_q_blocks].
  Tensor q_num_blocks, q_indices, full_q_num_blocks, full_q_indices;
  /// The mask_mod; absent for a pure block-level mask.
  std::optional<Program> mask_mod;

  int64_t num_q_blocks() const { return (q_len + q_block_size - 1) / q_block_size; }
  int64_t num_kv_blocks() const { return (kv_len + kv_block_size - 1) / kv_block_size; }
  /// Fraction of (q block, kv block) pairs that are computed (partial or full).
  double density() const;
  /// Block picture, one line per q block ('#' full, '+' partial, '.' empty) and sparsity,
  /// for batch b and head h (rows/columns subsampled beyond `max_size`).
  std::string to_string(int64_t b = 0, int64_t h = 0, int64_t max_size = 64) const;
};

/// Builds the BlockMask of `mask_mod` for [B, H, q_len, kv_len] with square blocks of
/// `block_size` (FlexAttention's create_block_mask, Dong et al. 2024). Memory is
/// O(number of blocks): interval analysis of the program classifies whole regions of
/// blocks (decides causal, windows, prefix-LM and sorted document masks without touching
/// elements), halving the regions it cannot decide down to single blocks, and only
/// undecided blocks are evaluated element by element. B or H of 1 broadcast when the
/// program does not read b / h. Q_LEN or KV_LEN of 0 gives a BlockMask without blocks.
/// Throws sdpa::Error (naming the argument) for B or H < 1, a negative length or
/// BLOCK_SIZE < 1, and for a mask_mod reading a captured tensor out of range anywhere
/// (blocks whose reads interval analysis cannot keep in bounds are evaluated in full).
BlockMask create_block_mask(const MaskMod& mask_mod, int64_t batch, int64_t num_heads,
                            int64_t q_len, int64_t kv_len, int64_t block_size = 128);
BlockMask create_block_mask(const Program& mask_mod, int64_t batch, int64_t num_heads,
                            int64_t q_len, int64_t kv_len, int64_t block_size = 128);
/// As above with blocks of q_block_size query rows by kv_block_size keys (torch's
/// BLOCK_SIZE=(q, kv)); the kernels read any pair of sizes.
BlockMask create_block_mask(const Program& mask_mod, int64_t batch, int64_t num_heads,
                            int64_t q_len, int64_t kv_len, int64_t q_block_size,
                            int64_t kv_block_size);

/// The kv-side lists of a BlockMask made by the caller (torch's BlockMask.from_kv_blocks):
/// num int32/int64 [B, H, q blocks] counts, indices [B, H, q blocks, n] (the first count
/// entries name kv blocks, in any order); the full lists may be undefined.
struct KvBlocks {
  Tensor num, indices, full_num, full_indices;
};

/// A BlockMask from block lists instead of a mask_mod: the blocks `blocks` lists as
/// partial run mask_mod when there is one and are kept whole when not; full blocks skip
/// it; all others are empty. The q-side transposes are derived. The lists are CPU
/// tensors; mask_mod may capture tensors of the device the calls run on (checked by each
/// call). Throws sdpa::Error for lists off the CPU, shapes that disagree with (q_len,
/// kv_len) and the block sizes, a count above the number of kv blocks, an index out of
/// range, or a block listed twice.
BlockMask block_mask_from_kv_blocks(const KvBlocks& blocks, int64_t q_len, int64_t kv_len,
                                    int64_t q_block_size, int64_t kv_block_size,
                                    std::optional<Program> mask_mod = std::nullopt);

/// mask_mod combinators (FlexAttention's and_masks / or_masks / noop_mask).
MaskMod and_masks(std::vector<MaskMod> mods);
MaskMod or_masks(std::vector<MaskMod> mods);
MaskMod noop_mask();

}  // namespace flex
}  // namespace sdpa
