// The pieces of a rank's queries against a K/V slice under a global band and documents.

#include "distributed/pieces.h"

#include <algorithm>
#include <memory>

#include "sdpa/error.h"
#include "sdpa/params.h"

namespace sdpa::distributed {
namespace {

std::optional<int64_t> tighter(std::optional<int64_t> a, std::optional<int64_t> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

// A segment's runs cut at document boundaries, each with its document (0 without).
struct DocumentRun {
  size_t document;
  Segment segment;
};

std::vector<DocumentRun> split(const std::vector<Segment>& segs, const std::vector<int64_t>& cu) {
  std::vector<DocumentRun> out;
  for (const Segment& s : segs) {
    if (cu.empty()) {
      out.push_back({0, s});
      continue;
    }
    for (int64_t pos = s.start; pos < s.start + s.length;) {
      // The last document starting at or before pos (empty documents are skipped).
      const size_t doc = static_cast<size_t>(std::upper_bound(cu.begin(), cu.end(), pos) -
                                             cu.begin()) - 1;
      const int64_t end = std::min(s.start + s.length, cu[doc + 1]);
      out.push_back({doc, {pos, end - pos, s.local + pos - s.start}});
      pos = end;
    }
  }
  return out;
}

}  // namespace

GlobalMask global_mask(const ContextParallelOptions& options, int64_t total) {
  SDPA_CHECK(!(options.is_causal && options.attn_mask.defined()),
             "context_parallel_attention: pass attn_mask or is_causal, not both");
  GlobalMask g;
  if (options.is_causal) g.right = 0;
  const AttnBiasPtr& bias = options.attn_mask.bias();
  if (!bias) return g;
  const char* expected = "context_parallel_attention: attn_mask: expected a mask over global "
                         "positions (LocalAttentionBias, CausalBias, BlockDiagonalBias with "
                         "the same query and key documents, or compose() of them), got ";
  SDPA_CHECK(!bias->needs_materialization(), expected, bias->describe());
  MaskDescriptor d;
  bias->lower(BiasShape{1, 1, total, total}, d);
  SDPA_CHECK(d.kv_lengths.empty() && d.alibi_slopes.empty() && !d.score_mod && !d.block_mask &&
                 d.dense_kind == DenseMaskKind::kNone,
             expected, bias->describe());
  if (d.has_documents()) {
    SDPA_CHECK(d.cu_seqlens_q == d.cu_seqlens_kv && d.cu_seqlens_q.front() == 0 &&
                   d.cu_seqlens_q.back() == total,
               expected, bias->describe(), " (documents must cover the ", total,
               " positions of the whole sequence)");
    g.cu_seqlens = d.cu_seqlens_q;
  }
  // With L = S and the same documents for queries and keys, a band in either alignment
  // and either frame is the same band of global offsets j - i.
  for (const DiagonalBand& band : d.bands) {
    SDPA_CHECK(band.frame != BandFrame::kValidKeys, expected, bias->describe());
    g.left = tighter(g.left, band.left);
    g.right = tighter(g.right, band.right);
  }
  return g;
}

std::vector<Piece> pieces(const std::vector<Segment>& q_segs, const std::vector<Segment>& kv_segs,
                          const GlobalMask& mask) {
  std::vector<Piece> out;
  const std::optional<int64_t> left = mask.left, right = mask.right;
  const std::vector<DocumentRun> kv_runs = split(kv_segs, mask.cu_seqlens);
  for (const DocumentRun& q_run : split(q_segs, mask.cu_seqlens)) {
    const Segment& qs = q_run.segment;
    for (const DocumentRun& kv_run : kv_runs) {
      if (kv_run.document != q_run.document) continue;
      const Segment& ks = kv_run.segment;
      const int64_t q_end = qs.start + qs.length, k_end = ks.start + ks.length;
      // The first query whose band reaches the keys (right edge), then the first key
      // inside that query's band (left edge): both windows become non-negative. The last
      // rows and keys are cut where the band leaves them (no row without keys).
      const int64_t q_first = right ? std::max(qs.start, ks.start - *right) : qs.start;
      const int64_t k_first = left ? std::max(ks.start, q_first - *left) : ks.start;
      const int64_t q_stop = left ? std::min(q_end, k_end + *left) : q_end;
      const int64_t k_stop = right ? std::min(k_end, q_end + *right) : k_end;
      if (q_first >= q_stop || k_first >= k_stop) continue;
      const bool all_seen = (!right || k_stop - 1 <= q_first + *right) &&
                            (!left || k_first >= q_stop - 1 - *left);
      AttnBiasPtr piece_mask;
      if (!all_seen) {
        const int64_t shift = q_first - k_first;
        piece_mask = std::make_shared<LocalAttentionBias>(
            left ? std::optional<int64_t>(*left - shift) : std::nullopt,
            right ? std::optional<int64_t>(shift + *right) : std::nullopt,
            DiagonalAlignment::kTopLeft);
      }
      out.push_back({qs.local + q_first - qs.start, qs.local + q_stop - qs.start,
                     ks.local + k_first - ks.start, ks.local + k_stop - ks.start, piece_mask,
                     q_first, k_first});
    }
  }
  return out;
}

}  // namespace sdpa::distributed
