// attention_varlen / attention_varlen_backward against a float64 reference written here
// from flash-attn's documented flash_attn_varlen_func semantics (each packed sequence
// attends only to its own keys; bottom-right causal and window per sequence; ALiBi;
// soft-cap): ragged lengths 0 ... 200 with sequences without queries or keys, GQA,
// Ev != E, strided inputs, bfloat16; the same with keys in a paged cache
// (attention_varlen_paged); bad packing and bad pages refused naming the argument.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "serving_util.h"
#include "sdpa/varlen.h"

namespace sdpa {
namespace {

using ::testing::HasSubstr;
using serving_test::int32s;
using serving_test::randn;

Tensor offsets(const std::vector<int64_t>& lengths) {
  Tensor t = Tensor::empty({static_cast<int64_t>(lengths.size()) + 1}, DType::kInt32);
  int32_t at = 0;
  t.data<int32_t>()[0] = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    t.data<int32_t>()[i + 1] = at += static_cast<int32_t>(lengths[i]);
  }
  return t;
}

int64_t total(const std::vector<int64_t>& lengths) {
  int64_t n = 0;
  for (int64_t x : lengths) n += x;
  return n;
}

double at(const Tensor& t, int64_t a, int64_t b, int64_t c) { return t.item({a, b, c}); }

// Float64 forward and backward of the packed call.
struct Reference {
  Tensor out, lse, grad_q, grad_k, grad_v;  // float64, the packed shapes
};

Reference reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
                    const std::vector<int64_t>& lq, const std::vector<int64_t>& lk,
                    const SequenceOptions& o) {
  const int64_t Hq = q.size(1), Hkv = k.size(1), E = q.size(2), Ev = v.size(2);
  const double scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(E)));
  const double inf = std::numeric_limits<double>::infinity();
  Reference r{Tensor::zeros({q.size(0), Hq, Ev}, DType::kFloat64),
              Tensor::full({Hq, q.size(0)}, -inf, DType::kFloat64),
              Tensor::zeros(q.sizes(), DType::kFloat64), Tensor::zeros(k.sizes(), DType::kFloat64),
              Tensor::zeros(v.sizes(), DType::kFloat64)};
  auto ref = [](Tensor& t, int64_t a, int64_t b, int64_t c) -> double& {
    return t.data<double>()[(a * t.size(1) + b) * t.size(2) + c];
  };
  const int64_t right = o.causal ? 0 : o.window_right;
  int64_t q0 = 0, k0 = 0;
  for (size_t s = 0; s < lq.size(); q0 += lq[s], k0 += lk[s], ++s) {
    const int64_t L = lq[s], S = lk[s];
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      for (int64_t i = 0; i < L; ++i) {
        const int64_t diagonal = i + S - L;
        std::vector<double> p(static_cast<size_t>(S), 0.0), slope(static_cast<size_t>(S), 1.0);
        double max = -inf;
        std::vector<bool> kept(static_cast<size_t>(S), false);
        for (int64_t j = 0; j < S; ++j) {
          if ((right >= 0 && j > diagonal + right) ||
              (o.window_left >= 0 && j < diagonal - o.window_left)) {
            continue;
          }
          double x = 0;
          for (int64_t e = 0; e < E; ++e) x += at(q, q0 + i, h, e) * at(k, k0 + j, hk, e);
          x *= scale;
          if (o.softcap > 0) {
            const double t = std::tanh(x / o.softcap);
            x = o.softcap * t;
            slope[static_cast<size_t>(j)] = 1.0 - t * t;
          }
          if (!o.alibi_slopes.empty()) {
            x -= o.alibi_slopes[static_cast<size_t>(h)] * std::abs(static_cast<double>(diagonal - j));
          }
          p[static_cast<size_t>(j)] = x;
          kept[static_cast<size_t>(j)] = true;
          max = std::max(max, x);
        }
        if (max == -inf) continue;
        double sum = 0;
        for (int64_t j = 0; j < S; ++j) {
          p[static_cast<size_t>(j)] = kept[static_cast<size_t>(j)] ? std::exp(p[static_cast<size_t>(j)] - max) : 0.0;
          sum += p[static_cast<size_t>(j)];
        }
        r.lse.data<double>()[h * r.lse.size(1) + q0 + i] = max + std::log(sum);
        double delta = 0;  // dO . out
        for (int64_t j = 0; j < S; ++j) p[static_cast<size_t>(j)] /= sum;
        for (int64_t e = 0; e < Ev; ++e) {
          double o_e = 0;
          for (int64_t j = 0; j < S; ++j) o_e += p[static_cast<size_t>(j)] * at(v, k0 + j, hk, e);
          ref(r.out, q0 + i, h, e) = o_e;
          delta += o_e * at(grad_out, q0 + i, h, e);
        }
        for (int64_t j = 0; j < S; ++j) {
          const double pj = p[static_cast<size_t>(j)];
          if (pj == 0.0) continue;
          double dp = 0;
          for (int64_t e = 0; e < Ev; ++e) {
            dp += at(grad_out, q0 + i, h, e) * at(v, k0 + j, hk, e);
            ref(r.grad_v, k0 + j, hk, e) += pj * at(grad_out, q0 + i, h, e);
          }
          const double ds = pj * (dp - delta) * slope[static_cast<size_t>(j)] * scale;
          for (int64_t e = 0; e < E; ++e) {
            ref(r.grad_q, q0 + i, h, e) += ds * at(k, k0 + j, hk, e);
            ref(r.grad_k, k0 + j, hk, e) += ds * at(q, q0 + i, h, e);
          }
        }
      }
    }
  }
  return r;
}

double max_error(const Tensor& got, const Tensor& want) {
  const Tensor g = got.to(DType::kFloat64).contiguous(), w = want.contiguous();
  double worst = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double a = g.data<double>()[i], b = w.data<double>()[i];
    if (std::isinf(b) && a == b) continue;
    worst = std::max(worst, std::isnan(a) ? std::numeric_limits<double>::infinity() : std::abs(a - b));
  }
  return worst;
}

struct Case {
  std::vector<int64_t> lq, lk;
  int64_t Hq = 4, Hkv = 2, E = 24, Ev = 20;
  SequenceOptions options;
  DType dtype = DType::kFloat32;
  bool strided = false;  // q, k, v as transposed views of [H, total, E] storage
  int64_t page_size = 0;  // > 0: also attention_varlen_paged with the keys in pages
};

// Packed keys [total_k, H, D] of sequences `lk` spread over shuffled pages of a pool with
// spare pages (filled with noise); table [B, max pages + 1].
struct Paged {
  Tensor k_pool, v_pool, table;
};
Paged page(const Tensor& k, const Tensor& v, const std::vector<int64_t>& lk, int64_t page_size) {
  const int64_t B = static_cast<int64_t>(lk.size());
  const int64_t width = (*std::max_element(lk.begin(), lk.end()) + page_size - 1) / page_size + 1;
  const int64_t num_pages = B * width + 2;
  std::vector<int32_t> ids(static_cast<size_t>(num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(5));
  Paged p{randn({num_pages, page_size, k.size(1), k.size(2)}, 6, k.dtype()),
          randn({num_pages, page_size, v.size(1), v.size(2)}, 7, v.dtype()),
          int32s(std::vector<int32_t>(ids.begin(), ids.begin() + B * width), {B, width})};
  int64_t begin = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < lk[static_cast<size_t>(b)]; ++j) {
      const int64_t id = p.table.data<int32_t>()[b * width + j / page_size];
      p.k_pool.select(0, id).select(0, j % page_size).copy_(k.select(0, begin + j));
      p.v_pool.select(0, id).select(0, j % page_size).copy_(v.select(0, begin + j));
    }
    begin += lk[static_cast<size_t>(b)];
  }
  return p;
}

void check(const Case& c, double tolerance, bool backward = true) {
  const int64_t tq = total(c.lq), tk = total(c.lk);
  auto make = [&](int64_t n, int64_t H, int64_t D, uint32_t seed) {
    return c.strided ? randn({H, n, D}, seed, c.dtype).transpose(0, 1) : randn({n, H, D}, seed, c.dtype);
  };
  const Tensor q = make(tq, c.Hq, c.E, 1), k = make(tk, c.Hkv, c.E, 2), v = make(tk, c.Hkv, c.Ev, 3);
  const Tensor grad_out = randn({tq, c.Hq, c.Ev}, 4, c.dtype);
  int64_t max_q = 0, max_k = 0;
  for (size_t s = 0; s < c.lq.size(); ++s) {
    max_q = std::max(max_q, c.lq[s]);
    max_k = std::max(max_k, c.lk[s]);
  }
  const Tensor cu_q = offsets(c.lq), cu_k = offsets(c.lk);
  const Reference want = reference(q.to(DType::kFloat64), k.to(DType::kFloat64), v.to(DType::kFloat64),
                                   grad_out.to(DType::kFloat64), c.lq, c.lk, c.options);
  const AttentionResult r = attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, c.options);
  ASSERT_EQ(r.out.sizes(), (Shape{tq, c.Hq, c.Ev}));
  ASSERT_EQ(r.lse.sizes(), (Shape{c.Hq, tq}));
  EXPECT_LE(max_error(r.out, want.out), tolerance);
  EXPECT_LE(max_error(r.lse, want.lse), tolerance);
  if (c.page_size > 0) {
    SCOPED_TRACE("paged, page_size " + std::to_string(c.page_size));
    const Paged paged = page(k, v, c.lk, c.page_size);
    const AttentionResult pr = attention_varlen_paged(q, paged.k_pool, paged.v_pool, cu_q, cu_k,
                                                      paged.table, max_q, max_k, c.options);
    EXPECT_LE(max_error(pr.out, want.out), tolerance);
    EXPECT_LE(max_error(pr.lse, want.lse), tolerance);
  }
  if (!backward) return;
  const AttentionGradients g =
      attention_varlen_backward(grad_out, q, k, v, r.out, r.lse, cu_q, cu_k, max_q, max_k, c.options);
  EXPECT_LE(max_error(g.grad_q, want.grad_q), 4 * tolerance);
  EXPECT_LE(max_error(g.grad_k, want.grad_k), 4 * tolerance);
  EXPECT_LE(max_error(g.grad_v, want.grad_v), 4 * tolerance);
}

// Lengths 1 ... 200 with a sequence without queries or keys, one with queries but no keys
// (out 0, lse -inf) and one with keys but no queries (its keys' gradients 0).
const std::vector<int64_t> kQueries = {1, 7, 0, 65, 3, 130, 0};
const std::vector<int64_t> kKeys = {5, 7, 0, 65, 0, 200, 9};

Case ragged() {
  Case c;
  c.lq = kQueries;
  c.lk = kKeys;
  return c;
}

TEST(Varlen, RaggedSequencesMatchReference) { check(ragged(), 2e-5); }

// Chunked prefill over a paged cache (flash_attn_varlen_func with block_table), pages of
// 16 (the bf16 kernels' page granularity) and of 7 (rows of one key tile span pages).
TEST(Varlen, PagedKeysMatchReference) {
  for (int64_t page_size : {16, 7}) {
    Case c = ragged();
    c.page_size = page_size;
    c.options.causal = true;
    check(c, 2e-5, /*backward=*/false);
    c.dtype = DType::kBFloat16;
    c.options.softcap = 3.0;
    check(c, 3e-2, /*backward=*/false);
  }
}

TEST(Varlen, BadPagesNameTheArgument) {
  const Tensor q = randn({10, 2, 8}, 1), pool = randn({6, 4, 1, 8}, 2);
  const Tensor cu_q = offsets({4, 6}), cu_k = offsets({5, 7});
  auto fails = [&](const Tensor& table, const Tensor& ck, const char* what) {
    try {
      (void)attention_varlen_paged(q, pool, pool, cu_q, ck, table, 6, 9);
      ADD_FAILURE() << "expected an error naming " << what;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
  };
  const Tensor table = int32s({0, 1, 2, 3, 4, 5}, {2, 3});
  EXPECT_EQ(attention_varlen_paged(q, pool, pool, cu_q, cu_k, table, 6, 9).out.sizes(),
            (Shape{10, 2, 8}));
  fails(int32s({0, 1, 2, 3, 6, 5}, {2, 3}), cu_k, "block_table[1][1] = 6 is outside");
  // Entries past a sequence's pages are not read: an unused -1 is fine.
  const Tensor unused = int32s({0, 1, -1, 3, 4, -1}, {2, 3});
  EXPECT_NO_THROW((void)attention_varlen_paged(q, pool, pool, cu_q, cu_k, unused, 6, 9));
  fails(int32s({0, 1, 2, 3}, {2, 2}), offsets({5, 9}), "sequence 1 has 9 keys, more than");
  fails(int32s({0, 1, 2}, {1, 3}), cu_k, "block_table: expected an int32 tensor [B = 2");
  fails(Tensor(), cu_k, "block_table: expected an int32 tensor [B, max_pages], got none");
}

TEST(Varlen, CausalIsBottomRightPerSequence) {
  Case c = ragged();
  c.options.causal = true;
  check(c, 2e-5);
  // More queries than keys: the first rows see nothing (out 0, lse -inf).
  c.lq = {9, 70};
  c.lk = {4, 63};
  c.Hkv = 4;
  check(c, 2e-5);
}

TEST(Varlen, WindowAndAlibi) {
  Case c = ragged();
  c.Hkv = 1;
  c.E = c.Ev = 33;
  c.options.window_left = 5;
  c.options.window_right = 3;
  c.options.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  check(c, 2e-5);
}

TEST(Varlen, SoftcapForwardAndBackward) {
  Case c = ragged();
  c.options.softcap = 2.0;
  c.options.scale = 0.8;
  check(c, 2e-5);
}

// Capped scores, then ALiBi (flash-attn's order), forward and backward.
TEST(Varlen, SoftcapThenAlibi) {
  Case c = ragged();
  c.options.softcap = 1.5;
  c.options.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  c.options.causal = true;
  check(c, 2e-5);
}

TEST(Varlen, StridedInputs) {
  Case c = ragged();
  c.strided = true;
  c.options.causal = true;
  check(c, 2e-5);
}

TEST(Varlen, Bfloat16) {
  Case c = ragged();
  c.dtype = DType::kBFloat16;
  check(c, 3e-2, /*backward=*/false);
}

TEST(Varlen, BadPackingNamesTheArgument) {
  const Tensor q = randn({10, 2, 8}, 1), k = randn({12, 2, 8}, 2), v = randn({12, 2, 8}, 3);
  const Tensor cu_q = offsets({4, 6}), cu_k = offsets({5, 7});
  auto fails = [&](const Tensor& cq, const Tensor& ck, int64_t mq, int64_t mk, const char* what,
                   SequenceOptions o = {}) {
    try {
      (void)attention_varlen(q, k, v, cq, ck, mq, mk, o);
      ADD_FAILURE() << "expected an error naming " << what;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
  };
  fails(cu_q.to(DType::kInt64), cu_k, 6, 7, "cu_seqlens_q: expected an int32");
  fails(offsets({4, 5}), cu_k, 6, 7, "cu_seqlens_q[B]: expected the packed length 10");
  fails(cu_q, offsets({5, 7, 0}), 6, 7, "cu_seqlens_k: expected 3 offsets");
  fails(cu_q, cu_k, 5, 7, "above max_seqlen_q = 5");
  fails(cu_q, cu_k, 6, 6, "above max_seqlen_k = 6");
  Tensor decreasing = offsets({4, 6});
  decreasing.data<int32_t>()[1] = 11;
  fails(decreasing, cu_k, 20, 7, "non-decreasing");
  Tensor shifted = offsets({4, 6});
  shifted.data<int32_t>()[0] = 1;
  fails(shifted, cu_k, 6, 7, "cu_seqlens_q[0]: expected 0");
  EXPECT_THROW((void)attention_varlen(q, k.slice(2, 0, 4), v, cu_q, cu_k, 6, 7), Error);
  const AttentionResult r = attention_varlen(q, k, v, cu_q, cu_k, 6, 7);
  try {
    (void)attention_varlen_backward(r.out.slice(0, 0, 9), q, k, v, r.out, r.lse, cu_q, cu_k, 6, 7);
    ADD_FAILURE() << "expected an error naming grad_out";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("grad_out: expected float32 [10, 2, 8]"));
  }
}

}  // namespace
}  // namespace sdpa
