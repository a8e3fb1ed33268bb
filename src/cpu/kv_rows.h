#pragma once
// The key and value rows of one (batch, kv head) of a call, through the page table when
// the call's K/V are a paged cache (KvPages).

#include "cpu/rows.h"
#include "sdpa/params.h"

namespace sdpa::cpu {

/// Batch b's pages of a paged call (p.kv_pages set), for k (values = false) or v.
inline PagedRows paged_rows(const AttentionParams& p, int64_t b, bool values) {
  const KvPages& pages = *p.kv_pages;
  const Tensor& table = pages.block_table;
  return {table.data<int32_t>() + b * table.stride(0), pages.page_size,
          values ? pages.v_page_stride : pages.k_page_stride};
}

/// Key rows of (b, hk), dequantized by the call's k_scale (KvDequant) when it has one.
inline RowView key_rows(const AttentionParams& p, int64_t b, int64_t hk) {
  RowView rows = p.kv_pages ? RowView(p.k, b, hk, paged_rows(p, b, false)) : RowView(p.k, b, hk);
  if (p.kv_dequant) rows.set_dequant_scale(p.kv_dequant->k_scale[static_cast<size_t>(hk)]);
  return rows;
}

/// Value rows of (b, hk), dequantized by the call's v_scale (KvDequant) when it has one.
inline RowView value_rows(const AttentionParams& p, int64_t b, int64_t hk) {
  RowView rows = p.kv_pages ? RowView(p.v, b, hk, paged_rows(p, b, true)) : RowView(p.v, b, hk);
  if (p.kv_dequant) rows.set_dequant_scale(p.kv_dequant->v_scale[static_cast<size_t>(hk)]);
  return rows;
}

}  // namespace sdpa::cpu
