// create_block_mask: block sparsity of a mask_mod in O(blocks) memory, by interval
// analysis first (of whole regions of blocks, halved until decided) and element evaluation
// only for undecided blocks.

#include <algorithm>
#include <exception>
#include <mutex>
#include <sstream>

#include "core/threading.h"
#include "flex/eval_scalar.h"
#include "flex/interval.h"
#include "sdpa/error.h"
#include "sdpa/flex.h"

namespace sdpa::flex {
namespace {

// Elementwise verdict of an undecided block.
// Evaluates a block's elements. Stops once both values were seen, unless `every_element`:
// a block whose captured reads interval analysis could not keep in bounds is evaluated
// completely, so an out-of-range read anywhere in it raises here, as PyTorch's dense
// evaluation would, instead of surfacing (or not) in a kernel later.
BlockVerdict evaluate_block(const Program& mask, const IndexBlock& block, bool every_element) {
  ScalarEvaluator eval(*mask.compiled(), mask.captured());
  bool any_true = false, any_false = false;
  for (int64_t i = block.q_lo; i <= block.q_hi; ++i) {
    for (int64_t j = block.kv_lo; j <= block.kv_hi; ++j) {
      (eval.run(0.0, block.b, block.h, i, j) != 0.0 ? any_true : any_false) = true;
      if (any_true && any_false && !every_element) return BlockVerdict::kUnknown;
    }
  }
  if (any_true && any_false) return BlockVerdict::kUnknown;
  return any_true ? BlockVerdict::kFull : BlockVerdict::kEmpty;
}

// One list of a BlockMask for one (b, h): num [n_rows] and indices [n_rows, n_cols].
struct BlockList {
  int32_t* num;
  int32_t* indices;
};

// Fills row r of `list` with the columns c < n_cols whose status (at status[c * step])
// equals `want`, the rest of the row zero. The q-side lists read the grid by columns
// (step nkv): the rows of a band of columns share cache lines, which stay in L2.
void fill_list_row(const uint8_t* status, int64_t step, int64_t n_cols, uint8_t want,
                   BlockList list, int64_t r) {
  int32_t* row = list.indices + r * n_cols;
  int32_t count = 0;
  for (int64_t c = 0; c < n_cols; ++c) {
    if (status[c * step] == want) row[count++] = static_cast<int32_t>(c);
  }
  std::fill(row + count, row + n_cols, 0);
  list.num[r] = count;
}

constexpr uint8_t kEmpty = 0, kPartial = 1, kFull = 2;

// Allocates the eight int32 lists of `m` (its sizes and block sizes set).
void allocate_lists(BlockMask& m) {
  const int64_t nq = m.num_q_blocks(), nkv = m.num_kv_blocks();
  m.kv_num_blocks = Tensor::empty({m.batch, m.num_heads, nq}, DType::kInt32);
  m.kv_indices = Tensor::empty({m.batch, m.num_heads, nq, nkv}, DType::kInt32);
  m.full_kv_num_blocks = Tensor::empty({m.batch, m.num_heads, nq}, DType::kInt32);
  m.full_kv_indices = Tensor::empty({m.batch, m.num_heads, nq, nkv}, DType::kInt32);
  m.q_num_blocks = Tensor::empty({m.batch, m.num_heads, nkv}, DType::kInt32);
  m.q_indices = Tensor::empty({m.batch, m.num_heads, nkv, nq}, DType::kInt32);
  m.full_q_num_blocks = Tensor::empty({m.batch, m.num_heads, nkv}, DType::kInt32);
  m.full_q_indices = Tensor::empty({m.batch, m.num_heads, nkv, nq}, DType::kInt32);
}

// Writes the lists of (b, h) item `item` from its status grid [nq, nkv], rows in
// parallel: the lists are the BlockMask's memory (16 MiB at L = S = 131072 with blocks of
// 128), and filling them took 87% of a causal mask's time on one thread.
void fill_item(BlockMask& m, int64_t item, const std::vector<uint8_t>& status) {
  const int64_t nq = m.num_q_blocks(), nkv = m.num_kv_blocks();
  const BlockList kv_partial{m.kv_num_blocks.data<int32_t>() + item * nq,
                             m.kv_indices.data<int32_t>() + item * nq * nkv};
  const BlockList kv_full{m.full_kv_num_blocks.data<int32_t>() + item * nq,
                          m.full_kv_indices.data<int32_t>() + item * nq * nkv};
  const BlockList q_partial{m.q_num_blocks.data<int32_t>() + item * nkv,
                            m.q_indices.data<int32_t>() + item * nkv * nq};
  const BlockList q_full{m.full_q_num_blocks.data<int32_t>() + item * nkv,
                         m.full_q_indices.data<int32_t>() + item * nkv * nq};
  // A row of either side writes two lists of its width in 4-byte entries.
  const int64_t rows = nq + nkv;
  const int threads = detail::ThreadingContext::current().threads_for(
      rows, {0, 16.0 * static_cast<double>(nq * nkv)});
  // No grid without q or kv blocks: the other side's rows then get counts of 0 and read
  // nothing (no offset into an empty grid).
  const uint8_t* grid = status.empty() ? nullptr : status.data();
  detail::run_region(threads, [&] {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      if (r < nq) {
        const uint8_t* row = grid == nullptr ? nullptr : grid + r * nkv;
        fill_list_row(row, 1, nkv, kPartial, kv_partial, r);
        fill_list_row(row, 1, nkv, kFull, kv_full, r);
      } else {
        const uint8_t* column = grid == nullptr ? nullptr : grid + (r - nq);
        fill_list_row(column, nkv, nq, kPartial, q_partial, r - nq);
        fill_list_row(column, nkv, nq, kFull, q_full, r - nq);
      }
    }
  });
}

// Marks the blocks one kv-side list names as `mark` in the status grids of every (b, h):
// num int32 [B, H, nq], indices int32 [B, H, nq, >= count]. Throws for counts or indices
// out of range and for a block named twice (in this list or an earlier one).
void mark_listed(const BlockMask& m, const Tensor& num, const Tensor& indices, const char* what,
                 uint8_t mark, std::vector<std::vector<uint8_t>>& grids) {
  const int64_t nq = m.num_q_blocks(), nkv = m.num_kv_blocks();
  SDPA_CHECK(num.dim() == 3 && num.size(0) == m.batch && num.size(1) == m.num_heads &&
                 num.size(2) == nq,
             "from_kv_blocks: expected ", what, "_num_blocks of shape [", m.batch, ", ",
             m.num_heads, ", ", nq, "], got ", shape_str(num.sizes()));
  SDPA_CHECK(indices.dim() == 4 && indices.size(0) == m.batch &&
                 indices.size(1) == m.num_heads && indices.size(2) == nq,
             "from_kv_blocks: expected ", what, "_indices of shape [", m.batch, ", ", m.num_heads,
             ", ", nq, ", n], got ", shape_str(indices.sizes()));
  const Tensor counts = num.to(DType::kInt64).contiguous();
  const Tensor lists = indices.to(DType::kInt64).contiguous();
  const int64_t width = lists.size(3);
  for (int64_t row = 0; row < m.batch * m.num_heads * nq; ++row) {
    const int64_t n = counts.data<int64_t>()[row];
    SDPA_CHECK(n >= 0 && n <= std::min(width, nkv), "from_kv_blocks: ", what,
               "_num_blocks: expected counts in [0, ", std::min(width, nkv), "], got ", n);
    std::vector<uint8_t>& grid = grids[row / nq];
    for (int64_t e = 0; e < n; ++e) {
      const int64_t kb = lists.data<int64_t>()[row * width + e];
      SDPA_CHECK(kb >= 0 && kb < nkv, "from_kv_blocks: ", what, "_indices: expected kv block "
                 "indices in [0, ", nkv, "), got ", kb);
      uint8_t& cell = grid[(row % nq) * nkv + kb];
      SDPA_CHECK(cell == kEmpty, "from_kv_blocks: kv block ", kb, " is listed twice for q block ",
                 row % nq);
      cell = mark;
    }
  }
}

// Work of classifying one block, in the FLOPs one thread of the flash kernels does
// meanwhile: about 60 ns (a causal mask decided by interval analysis alone,
// bench/block_mask_build.cpp on one thread) at 50 GFLOP/s. Blocks that need their elements
// evaluated cost up to 100 times more, so this errs towards too few threads.
constexpr double kClassifyBlockFlops = 3000;

// Rows of blocks per task of the parallel classification.
constexpr int64_t kBandRows = 8;
// Elements a captured read of a region of several blocks may scan for its value range.
// Wide regions mostly split anyway (a document mask's, across many documents), and
// scanning their reads cost more than the blocks below them: L = 131072, documents of
// 4096, two threads, 73-78 ms without this cap, 50-61 ms with it. Single blocks keep the
// default.
constexpr int64_t kRegionMaxScan = 4096;

// One (b, h) of a mask being classified: the blocks' statuses [nq, nkv].
struct Classification {
  const Program& mask_mod;
  const BlockMask& m;
  int64_t b, h;
  std::vector<uint8_t>& status;
};

// Classifies the blocks [qb0, qb1) x [kb0, kb1). Interval analysis runs on the whole region
// first: a region it decides (every element kept, or none, and every captured read in
// bounds) is filled at once, any other is halved along its longer side down to single
// blocks, which are evaluated element by element when still undecided. The statuses are
// the ones block-by-block classification gives (a region's verdict holds for each of its
// blocks), and a causal mask of 1024 x 1024 blocks takes a few analyses per diagonal block
// instead of one per block.
void classify_region(const Classification& c, int64_t qb0, int64_t qb1, int64_t kb0, int64_t kb1) {
  const BlockMask& m = c.m;
  const int64_t q1 = std::min(m.q_len, qb1 * m.q_block_size);
  const int64_t k1 = std::min(m.kv_len, kb1 * m.kv_block_size);
  const IndexBlock region{c.b, c.h, qb0 * m.q_block_size, q1 - 1, kb0 * m.kv_block_size, k1 - 1};
  bool reads_in_bounds = true;
  const bool single = qb1 - qb0 == 1 && kb1 - kb0 == 1;
  BlockVerdict v = single ? classify_block(*c.mask_mod.compiled(), c.mask_mod.captured(), region,
                                           &reads_in_bounds)
                          : classify_block(*c.mask_mod.compiled(), c.mask_mod.captured(), region,
                                           &reads_in_bounds, kRegionMaxScan);
  if (single && (v == BlockVerdict::kUnknown || !reads_in_bounds)) {
    v = evaluate_block(c.mask_mod, region, !reads_in_bounds);
  }
  if (single || (reads_in_bounds && v != BlockVerdict::kUnknown)) {
    const uint8_t mark = v == BlockVerdict::kFull    ? kFull
                         : v == BlockVerdict::kEmpty ? kEmpty
                                                     : kPartial;
    const int64_t nkv = m.num_kv_blocks();
    for (int64_t qb = qb0; qb < qb1; ++qb) {
      std::fill(c.status.begin() + qb * nkv + kb0, c.status.begin() + qb * nkv + kb1, mark);
    }
    return;
  }
  if (qb1 - qb0 >= kb1 - kb0) {
    const int64_t mid = qb0 + (qb1 - qb0) / 2;
    classify_region(c, qb0, mid, kb0, kb1);
    classify_region(c, mid, qb1, kb0, kb1);
  } else {
    const int64_t mid = kb0 + (kb1 - kb0) / 2;
    classify_region(c, qb0, qb1, kb0, mid);
    classify_region(c, qb0, qb1, mid, kb1);
  }
}

}  // namespace

BlockMask create_block_mask(const MaskMod& mask_mod, int64_t batch, int64_t num_heads,
                            int64_t q_len, int64_t kv_len, int64_t block_size) {
  return create_block_mask(Program::from_mask_mod(mask_mod), batch, num_heads, q_len, kv_len,
                           block_size, block_size);
}

BlockMask create_block_mask(const Program& mask_mod, int64_t batch, int64_t num_heads,
                            int64_t q_len, int64_t kv_len, int64_t block_size) {
  return create_block_mask(mask_mod, batch, num_heads, q_len, kv_len, block_size, block_size);
}

BlockMask create_block_mask(const Program& mask_mod, int64_t batch, int64_t num_heads,
                            int64_t q_len, int64_t kv_len, int64_t q_block_size,
                            int64_t kv_block_size) {
  SDPA_CHECK(mask_mod.is_mask(), "create_block_mask: expected a mask_mod program, got a "
             "score_mod");
  require_captured_on(mask_mod, Device{}, "create_block_mask (on the CPU)");
  SDPA_CHECK(batch >= 1 && num_heads >= 1, "create_block_mask: expected B >= 1 and H >= 1, got ",
             batch, " and ", num_heads);
  SDPA_CHECK(q_len >= 0 && kv_len >= 0, "create_block_mask: expected non-negative Q_LEN and "
             "KV_LEN, got ", q_len, " and ", kv_len);
  SDPA_CHECK(q_block_size >= 1 && kv_block_size >= 1, "create_block_mask: expected BLOCK_SIZE "
             ">= 1, got (", q_block_size, ", ", kv_block_size, ")");
  const CompiledProgram& prog = *mask_mod.compiled();
  BlockMask m;
  // A mask that ignores b (or h) is stored once and broadcast (FlexAttention does the same
  // with B=None / H=None).
  m.batch = prog.uses_batch ? batch : 1;
  m.num_heads = prog.uses_head ? num_heads : 1;
  m.q_len = q_len;
  m.kv_len = kv_len;
  m.q_block_size = q_block_size;
  m.kv_block_size = kv_block_size;
  m.mask_mod = mask_mod;
  const int64_t nq = m.num_q_blocks(), nkv = m.num_kv_blocks();
  const int64_t bh = m.batch * m.num_heads;
  allocate_lists(m);

  std::exception_ptr error;
  std::mutex error_mutex;
  const int64_t bands = (nq + kBandRows - 1) / kBandRows;
  // The estimate of block-by-block classification: undecided regions come down to it.
  const int threads = detail::ThreadingContext::current().threads_for(
      bands, {kClassifyBlockFlops * static_cast<double>(nq * nkv), 0});
  for (int64_t item = 0; item < bh; ++item) {
    std::vector<uint8_t> status(static_cast<size_t>(nq * nkv));
    const Classification c{mask_mod, m, item / m.num_heads, item % m.num_heads, status};
    detail::run_region(threads, [&] {
#pragma omp for schedule(dynamic, 1)
      for (int64_t band = 0; band < bands; ++band) {
        try {
          if (nkv > 0) {
            classify_region(c, band * kBandRows, std::min(nq, (band + 1) * kBandRows), 0, nkv);
          }
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
      }
    });
    if (error) std::rethrow_exception(error);
    fill_item(m, item, status);
  }
  return m;
}

BlockMask block_mask_from_kv_blocks(const KvBlocks& blocks, int64_t q_len, int64_t kv_len,
                                    int64_t q_block_size, int64_t kv_block_size,
                                    std::optional<Program> mask_mod) {
  SDPA_CHECK(blocks.num.defined() && blocks.indices.defined(), "from_kv_blocks: expected "
             "kv_num_blocks and kv_indices");
  SDPA_CHECK(blocks.full_num.defined() == blocks.full_indices.defined(), "from_kv_blocks: "
             "expected both full_kv_num_blocks and full_kv_indices, or neither");
  for (const Tensor* t : {&blocks.num, &blocks.indices, &blocks.full_num, &blocks.full_indices}) {
    SDPA_CHECK(!t->defined() || t->device().type == DeviceType::kCPU,
               "from_kv_blocks: expected block lists on cpu, got ", device_name(t->device()));
  }
  SDPA_CHECK(q_len >= 0 && kv_len >= 0, "from_kv_blocks: expected non-negative Q_LEN and "
             "KV_LEN, got ", q_len, " and ", kv_len);
  SDPA_CHECK(q_block_size >= 1 && kv_block_size >= 1,
             "from_kv_blocks: expected BLOCK_SIZE "
             ">= 1, got (",
             q_block_size, ", ", kv_block_size, ")");
  SDPA_CHECK(!mask_mod || mask_mod->is_mask(), "from_kv_blocks: expected a mask_mod program, "
             "got a score_mod");
  SDPA_CHECK(blocks.num.dim() == 3 && blocks.num.size(0) >= 1 && blocks.num.size(1) >= 1,
             "from_kv_blocks: expected kv_num_blocks of shape [B, H, q blocks], got ",
             shape_str(blocks.num.sizes()));
  BlockMask m;
  m.batch = blocks.num.size(0);
  m.num_heads = blocks.num.size(1);
  m.q_len = q_len;
  m.kv_len = kv_len;
  m.q_block_size = q_block_size;
  m.kv_block_size = kv_block_size;
  m.mask_mod = std::move(mask_mod);
  const int64_t nq = m.num_q_blocks(), nkv = m.num_kv_blocks();
  std::vector<std::vector<uint8_t>> grids(static_cast<size_t>(m.batch * m.num_heads),
                                          std::vector<uint8_t>(nq * nkv, kEmpty));
  mark_listed(m, blocks.num, blocks.indices, "kv", kPartial, grids);
  if (blocks.full_num.defined()) {
    mark_listed(m, blocks.full_num, blocks.full_indices, "full_kv", kFull, grids);
  }
  allocate_lists(m);
  for (int64_t item = 0; item < m.batch * m.num_heads; ++item) fill_item(m, item, grids[item]);
  return m;
}

double BlockMask::density() const {
  const int64_t nq = num_q_blocks(), nkv = num_kv_blocks();
  if (nq == 0 || nkv == 0) return 0.0;
  int64_t computed = 0;
  const int64_t rows = batch * num_heads * nq;
  for (int64_t r = 0; r < rows; ++r) {
    computed += kv_num_blocks.data<int32_t>()[r] + full_kv_num_blocks.data<int32_t>()[r];
  }
  return static_cast<double>(computed) / static_cast<double>(rows * nkv);
}

std::string BlockMask::to_string(int64_t b, int64_t h, int64_t max_size) const {
  const int64_t nq = num_q_blocks(), nkv = num_kv_blocks();
  const int64_t bb = batch == 1 ? 0 : b, hh = num_heads == 1 ? 0 : h;
  SDPA_CHECK(bb >= 0 && bb < batch && hh >= 0 && hh < num_heads, "BlockMask::to_string: (b, h) = (",
             b, ", ", h, ") out of range for [", batch, ", ", num_heads, "]");
  const int64_t row0 = (bb * num_heads + hh) * nq;
  std::vector<uint8_t> grid(static_cast<size_t>(nq * nkv), kEmpty);
  for (int64_t r = 0; r < nq; ++r) {
    const int32_t* part = kv_indices.data<int32_t>() + (row0 + r) * nkv;
    const int32_t* full = full_kv_indices.data<int32_t>() + (row0 + r) * nkv;
    for (int32_t k = 0; k < kv_num_blocks.data<int32_t>()[row0 + r]; ++k) grid[r * nkv + part[k]] = kPartial;
    for (int32_t k = 0; k < full_kv_num_blocks.data<int32_t>()[row0 + r]; ++k) grid[r * nkv + full[k]] = kFull;
  }
  const int64_t step_q = std::max<int64_t>(1, (nq + max_size - 1) / max_size);
  const int64_t step_kv = std::max<int64_t>(1, (nkv + max_size - 1) / max_size);
  std::ostringstream os;
  os << "BlockMask [" << batch << ", " << num_heads << ", " << q_len << ", " << kv_len
     << "], block " << q_block_size << "x" << kv_block_size << ", density "
     << density() * 100.0 << "% (sparsity " << (1.0 - density()) * 100.0 << "%)";
  if (step_q > 1 || step_kv > 1) os << ", shown every " << step_q << "x" << step_kv << " blocks";
  os << "  ('#' full, '+' partial, '.' empty)\n";
  for (int64_t r = 0; r < nq; r += step_q) {
    for (int64_t c = 0; c < nkv; c += step_kv) {
      // A shown cell summarizes its step_q x step_kv group: any partial, else any full.
      uint8_t cell = kEmpty;
      for (int64_t rr = r; rr < std::min(nq, r + step_q); ++rr) {
        for (int64_t cc = c; cc < std::min(nkv, c + step_kv); ++cc) {
          const uint8_t s = grid[rr * nkv + cc];
          if (s == kPartial || (s == kFull && cell == kEmpty)) cell = s;
        }
      }
      os << (cell == kFull ? '#' : cell == kPartial ? '+' : '.');
    }
    os << '\n';
  }
  return os.str();
}

MaskMod and_masks(std::vector<MaskMod> mods) {
  return [mods = std::move(mods)](const Expr& b, const Expr& h, const Expr& q, const Expr& kv) {
    Expr all = true;
    for (const MaskMod& m : mods) all = all & m(b, h, q, kv);
    return all;
  };
}

MaskMod or_masks(std::vector<MaskMod> mods) {
  return [mods = std::move(mods)](const Expr& b, const Expr& h, const Expr& q, const Expr& kv) {
    Expr any = false;
    for (const MaskMod& m : mods) any = any | m(b, h, q, kv);
    return any;
  };
}

MaskMod noop_mask() {
  return [](const Expr&, const Expr&, const Expr&, const Expr&) { return Expr(true); };
}

}  // namespace sdpa::flex
