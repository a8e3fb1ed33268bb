// Lowering of AttentionParams to a cuDNN graph description: the checks the CUDNN backend
// applies before asking cuDNN itself (cuDNN's own support check runs when the graph is
// built, graph_cache.cpp).

#include "cudnn/graph_key.h"

#include "core/fnv.h"
#include "cudnn/block_mask_band.h"
#include "cudnn/native_score_mod.h"
#include "cudnn/score_mod_graph.h"

#include <bit>
#include <sstream>

namespace sdpa::cudnn {
namespace {

bool aligned_rows(const char* name, const Tensor& t, Reasons& r) {
  const bool ok = rows_aligned(t);
  if (!ok && r.collect) {
    std::ostringstream os;
    os << name << ": cuDNN needs a dense last dimension and 16-byte aligned rows, got strides "
       << shape_str(t.strides());
    r.add(os.str());
  }
  return ok;
}

TensorSpec spec_of(const Tensor& t) {
  TensorSpec s;
  for (int d = 0; d < 4; ++d) {
    s.dims[d] = t.size(d);
    s.strides[d] = t.stride(d);
  }
  return s;
}

int64_t float_bits(double value) {
  return std::bit_cast<uint32_t>(static_cast<float>(value));
}

// Lowers `program` as the call's score_mod subgraph.
bool lower_program(const AttentionParams& p, std::shared_ptr<const flex::Program> program,
                   bool additive, GraphSpec& s, Reasons& r, ScoreModCall* score_mod) {
  std::shared_ptr<const ScoreModGraph> lowered = lower_score_mod_graph(p, *program, r, additive);
  if (lowered == nullptr) return false;
  s.has_score_mod = 1;
  s.score_mod_fingerprint = static_cast<int64_t>(lowered->fingerprint);
  if (score_mod != nullptr) *score_mod = {std::move(lowered), std::move(program)};
  return true;
}

bool lower_mask(const AttentionParams& p, GraphSpec& s, Reasons& r, ScoreModCall* score_mod) {
  const MaskDescriptor& m = p.mask;
  bool ok = true;
  // A BlockMask's band (block_mask_band.h) joins the call's bands, or its score_mod.
  std::optional<DiagonalBand> block_band;
  std::vector<DiagonalBand> with_block_band;
  if (m.block_mask) {
    if (m.has_documents() || !m.kv_lengths.empty() || !m.alibi_slopes.empty()) {
      r.add("flex: cuDNN takes a BlockMask without documents, padding or ALiBi beside it");
      ok = false;
    }
    block_band = block_mask_band(p, r);
    ok = block_band.has_value() && ok;
    if (block_band && !m.score_mod && (block_band->left || block_band->right)) {
      with_block_band = m.bands;
      with_block_band.push_back(*block_band);
    }
  }
  const std::vector<DiagonalBand>& bands = with_block_band.empty() ? m.bands : with_block_band;
  if (m.score_mod) {
    // cuDNN turns its own masks off under a score_mod and adds a bias after it, where
    // sdpa's score_mod reads the biased score.
    if (!m.bands.empty() || m.has_documents() || !m.kv_lengths.empty() ||
        !m.alibi_slopes.empty() || m.dense_kind != DenseMaskKind::kNone) {
      r.add("flex: cuDNN takes a score_mod alone, without is_causal, windows, documents, "
            "padding, ALiBi or attn_mask beside it");
      ok = false;
    }
    if (block_band) {
      ok = lower_program(p, banded_score_mod(m.score_mod, *block_band), false, s, r, score_mod) &&
           ok;
    } else {
      ok = lower_program(p, m.score_mod, false, s, r, score_mod) && ok;
    }
  }
  // ALiBi, key padding and documents (with the bands beside them) become a score_mod:
  // cuDNN's ALiBi fixes the slopes, and its padding and ragged layouts are not lowered.
  const bool native = needs_native_score_mod(m);
  if (native) {
    if (m.dense_kind != DenseMaskKind::kNone) {
      r.add("mask: ALiBi, key padding and documents reach cuDNN as a score_mod, which takes "
            "no attn_mask beside it");
      ok = false;
    } else if (!m.alibi_slopes.empty() &&
               static_cast<int64_t>(m.alibi_slopes.size()) != p.num_heads_q) {
      r.add("mask: ALiBi needs one slope per query head");
      ok = false;
    } else if (std::shared_ptr<const flex::Program> program = native_score_mod(p, r)) {
      ok = lower_program(p, std::move(program), true, s, r, score_mod) && ok;
    } else {
      ok = false;
    }
  } else if (bands.size() > 1) {
    r.add("mask: cuDNN takes one diagonal band, got ", std::to_string(bands.size()));
    ok = false;
  } else if (bands.size() == 1) {
    const DiagonalBand& b = bands[0];
    if (b.frame != BandFrame::kSequence) {
      r.add("mask: a band measured per document or in valid keys is not lowered to cuDNN");
      ok = false;
    }
    // Rows with no key at all (a band right of the diagonal's start, or bottom-right with
    // more queries than keys) must give zeros; cuDNN's kernels are not asked to.
    const bool empty_rows =
        (b.right && *b.right < 0) || (b.left && *b.left < 0) ||
        (b.alignment == DiagonalAlignment::kBottomRight && p.q_len > p.kv_len);
    if (b.left && p.q_len > p.kv_len) {
      r.add("mask: cuDNN's sliding window needs q_len <= kv_len, got ", std::to_string(p.q_len),
            " > ", std::to_string(p.kv_len));
      ok = false;
    }
    if (empty_rows) {
      r.add("mask: this band leaves rows without keys (zeros by sdpa's rule); cuDNN is not "
            "used for them");
      ok = false;
    }
    s.has_band = 1;
    s.bottom_right = b.alignment == DiagonalAlignment::kBottomRight;
    s.has_left = b.left.has_value();
    s.left = b.left.value_or(0);
    s.has_right = b.right.has_value();
    s.right = b.right.value_or(0);
  }
  if (m.dense_kind == DenseMaskKind::kBoolKeep) {
    r.add("attn_mask: cuDNN takes float (additive) masks, got a bool mask");
    ok = false;
  } else if (m.dense_kind == DenseMaskKind::kAdditive) {
    // A mask cuDNN cannot read in place (rows of odd length, broadcast rows or columns)
    // is copied to aligned rows per call: the same values, read the same way.
    const Tensor bias = bias_view(p);
    s.has_bias = 1;
    s.bias = spec_of(bias);
    if (!rows_aligned(bias)) {
      s.bias_repacked = 1;
      const int64_t pitch = (bias.size(3) + 7) / 8 * 8;  // 16 bytes of 16-bit elements
      s.bias.strides = {bias.size(1) * bias.size(2) * pitch, bias.size(2) * pitch, pitch, 1};
    }
  }
  if (p.backward && p.attn_mask_requires_grad) {
    r.add("attn_mask requires grad: only MATH computes grad_attn_mask");
    ok = false;
  }
  return ok;
}

}  // namespace

// cuDNN reads each row with 16-byte vector loads: the innermost dimension must be dense
// and every other stride and the base address a multiple of 16 bytes.
bool rows_aligned(const Tensor& t) {
  const int64_t esize = static_cast<int64_t>(element_size(t.dtype()));
  bool ok = t.stride(3) == 1 || t.size(3) == 1;
  for (int64_t d = 0; d < 3 && ok; ++d) ok = t.size(d) == 1 || (t.stride(d) * esize) % 16 == 0;
  return ok && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

Tensor bias_view(const AttentionParams& p) {
  Tensor bias = p.mask.dense;
  for (int64_t d = 0; d < 2; ++d) {
    if (bias.stride(d) == 0) bias = bias.slice(d, 0, 1);
  }
  return bias;
}

size_t GraphSpecHash::operator()(const GraphSpec& s) const {
  // FNV-1a over the struct's int64 words (no padding), one multiply per word: the
  // lookup runs on every call.
  static_assert(sizeof(GraphSpec) % sizeof(int64_t) == 0);
  int64_t words[sizeof(GraphSpec) / sizeof(int64_t)];
  std::memcpy(words, &s, sizeof(s));
  sdpa::detail::Fnv1a hash;
  for (int64_t w : words) hash.word(static_cast<uint64_t>(w));
  return static_cast<size_t>(hash.value ^ (hash.value >> 32));
}

bool lower(const AttentionParams& p, GraphSpec& s, Reasons& r, ScoreModCall* score_mod) {
  bool ok = true;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    r.add("dtype: cuDNN attention takes float16 and bfloat16, got ", std::string(dtype_name(p.dtype)));
    ok = false;
  }
  if (p.head_dim_qk == 0 || p.head_dim_vo == 0 || p.head_dim_qk % 8 != 0 ||
      p.head_dim_vo % 8 != 0 || p.head_dim_qk > 256 || p.head_dim_vo > 256) {
    if (r.collect) {
      r.add("head_dim: cuDNN takes multiples of 8 up to 256, got E = ",
            std::to_string(p.head_dim_qk), ", Ev = ", std::to_string(p.head_dim_vo));
    }
    ok = false;
  }
  if (!ok) return false;
  ok = aligned_rows("query", p.q, r) && ok;
  ok = aligned_rows("key", p.k, r) && ok;
  ok = aligned_rows("value", p.v, r) && ok;
  s.backward = p.backward;
  s.dtype = static_cast<int64_t>(p.dtype);
  s.device = p.device.index;
  s.q = spec_of(p.q);
  s.k = spec_of(p.k);
  s.v = spec_of(p.v);
  if (p.backward) {
    ok = aligned_rows("out", p.out, r) && ok;
    ok = aligned_rows("grad_out", p.grad_out, r) && ok;
    s.out = spec_of(p.out);
    s.grad_out = spec_of(p.grad_out);
    s.lse = spec_of(p.lse.unsqueeze(3));
    s.deterministic = p.deterministic;
  }
  s.scale_bits = float_bits(p.scale);
  s.dropout_bits = p.has_dropout() ? float_bits(p.dropout.p) : 0;
  if (p.dropout.positioned()) {
    r.add("dropout_position: cuDNN draws its own dropout mask, not sdpa's at a position");
    ok = false;
  }
  return lower_mask(p, s, r, score_mod) && ok;
}

std::string describe(const GraphSpec& s) {
  std::ostringstream os;
  os << (s.backward ? "backward " : "forward ") << dtype_name(static_cast<DType>(s.dtype))
     << " q [" << s.q.dims[0] << ", " << s.q.dims[1] << ", " << s.q.dims[2] << ", "
     << s.q.dims[3] << "] k/v [" << s.k.dims[1] << " heads, " << s.k.dims[2] << " keys]";
  if (s.has_band) {
    os << " band(" << (s.bottom_right ? "bottom-right" : "top-left");
    if (s.has_left) os << ", left " << s.left;
    if (s.has_right) os << ", right " << s.right;
    os << ")";
  }
  if (s.has_bias) os << " bias";
  if (s.dropout_bits) os << " dropout";
  if (s.has_score_mod) os << " score_mod";
  return os.str();
}

}  // namespace sdpa::cudnn
