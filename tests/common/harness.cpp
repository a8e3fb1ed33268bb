#include "common/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <sstream>

namespace sdpa::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> normal_values(int64_t n, double stddev, DType dtype, std::mt19937& rng) {
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<double> values(static_cast<size_t>(n));
  for (double& x : values) x = round_to_dtype(dist(rng), dtype);
  return values;
}

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string index_str(const Shape& sizes, int64_t linear) {
  std::vector<int64_t> idx(sizes.size());
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    const int64_t s = std::max<int64_t>(sizes[d], 1);
    idx[d] = linear % s;
    linear /= s;
  }
  std::ostringstream os;
  os << "[";
  for (size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
  os << "]";
  return os.str();
}

}  // namespace

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kBHSD: return "bhsd";
    case Layout::kBSHD: return "bshd";
    case Layout::kSliceD: return "slice_d";
    case Layout::kStridedD: return "strided_d";
    case Layout::kHeadDimMajor: return "head_dim_major";
  }
  return "?";
}

Tensor random_tensor(const Shape& shape, DType dtype, Layout layout, std::mt19937& rng,
                     double stddev) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t n = shape[rank - 2], d = shape[rank - 1];
  Shape alloc = shape;
  Tensor base, view;
  switch (layout) {
    case Layout::kBHSD:
      base = Tensor::empty(alloc, dtype);
      view = base;
      break;
    case Layout::kBSHD:  // heads and sequence swapped in memory
      std::swap(alloc[rank - 3], alloc[rank - 2]);
      base = Tensor::empty(alloc, dtype);
      view = base.transpose(rank - 3, rank - 2);
      break;
    case Layout::kSliceD:
      alloc[rank - 1] = d + 3;
      base = Tensor::empty(alloc, dtype);
      view = base.slice(rank - 1, 1, d + 1);
      break;
    case Layout::kStridedD:
      alloc[rank - 1] = 2 * d;
      base = Tensor::empty(alloc, dtype);
      view = base.slice(rank - 1, 0, 2 * d, 2);
      break;
    case Layout::kHeadDimMajor:
      alloc[rank - 2] = d;
      alloc[rank - 1] = n;
      base = Tensor::empty(alloc, dtype);
      view = base.transpose(rank - 2, rank - 1);
      break;
  }
  // Poison the padding so a kernel reading outside the view produces NaN.
  fill_from_doubles(base, std::vector<double>(static_cast<size_t>(numel_of(alloc)),
                                              std::numeric_limits<double>::quiet_NaN()));
  fill_from_doubles(view, normal_values(numel_of(shape), stddev, dtype, rng));
  return view;
}

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return {1e-12, 1e-6, 1e-6};  // lse is float32
    case DType::kFloat32: return {2e-5, 1e-5, 1e-5};
    case DType::kFloat16: return {2e-3, 1e-4, 1e-4};
    case DType::kBFloat16: return {2e-2, 1e-4, 1e-4};
    default: return {0, 0, 0};
  }
}

std::string Case::describe() const {
  std::ostringstream os;
  os << "B=" << batch << " Hq=" << heads_q << " Hkv=" << heads_kv << " L=" << q_len
     << " S=" << kv_len << " E=" << head_dim << " Ev=" << ev() << " " << dtype_name(dtype)
     << " q:" << layout_name(q_layout) << " kv:" << layout_name(kv_layout);
  if (unbatched) os << " 3-D";
  if (mask != MaskKind::kNone) {
    os << " mask=" << (mask == MaskKind::kBool ? "bool" : "float")
       << (mask_shape.empty() ? std::string("[full]") : shape_str(mask_shape));
    if (!masked_rows.empty()) {
      os << " masked_rows={";
      for (size_t i = 0; i < masked_rows.size(); ++i) os << (i ? "," : "") << masked_rows[i];
      os << "}";
    }
  }
  if (causal) os << " causal";
  if (enable_gqa) os << " gqa";
  if (scale) os << " scale=" << *scale;
  if (input_std != 1.0) os << " input_std=" << input_std;
  if (dropout_p > 0) os << " dropout_p=" << dropout_p << " seed=" << philox.seed;
  os << " input_seed=" << seed;
  return os.str();
}

CaseInputs make_inputs(const Case& c) {
  std::mt19937 rng(c.seed);
  auto shape = [&](int64_t h, int64_t n, int64_t d) {
    return c.unbatched ? Shape{h, n, d} : Shape{c.batch, h, n, d};
  };
  CaseInputs in;
  in.q = random_tensor(shape(c.heads_q, c.q_len, c.head_dim), c.dtype, c.q_layout, rng,
                       c.input_std);
  in.k = random_tensor(shape(c.heads_kv, c.kv_len, c.head_dim), c.dtype, c.kv_layout, rng,
                       c.input_std);
  in.v = random_tensor(shape(c.heads_kv, c.kv_len, c.ev()), c.dtype, c.kv_layout, rng,
                       c.input_std);
  if (c.mask != MaskKind::kNone) {
    const Shape full = c.unbatched ? Shape{c.heads_q, c.q_len, c.kv_len}
                                   : Shape{c.batch, c.heads_q, c.q_len, c.kv_len};
    const Shape mshape = c.mask_shape.empty() ? full : c.mask_shape;
    const DType mdtype = c.mask == MaskKind::kBool ? DType::kBool : c.dtype;
    std::vector<double> values(static_cast<size_t>(numel_of(mshape)));
    std::bernoulli_distribution keep(0.75);
    std::normal_distribution<double> bias(0.0, 1.0);
    for (double& x : values) {
      const bool kept = keep(rng);
      if (c.mask == MaskKind::kBool) {
        x = kept ? 1.0 : 0.0;
      } else {
        x = kept ? round_to_dtype(bias(rng), c.dtype) : -kInf;
      }
    }
    if (!c.masked_rows.empty()) {
      const int64_t rank = static_cast<int64_t>(mshape.size());
      if (rank < 2 || mshape[rank - 2] != c.q_len) {
        throw std::logic_error("Case::masked_rows needs a mask with an L dimension");
      }
      const int64_t cols = mshape[rank - 1];
      const int64_t rows = mshape[rank - 2];
      for (int64_t n = 0; n < static_cast<int64_t>(values.size()); ++n) {
        const int64_t i = (n / cols) % rows;
        if (std::find(c.masked_rows.begin(), c.masked_rows.end(), i) != c.masked_rows.end()) {
          values[n] = c.mask == MaskKind::kBool ? 0.0 : -kInf;
        }
      }
    }
    in.mask = Tensor::empty(mshape, mdtype);
    fill_from_doubles(in.mask, values);
    in.options.attn_mask = in.mask;
  }
  in.options.is_causal = c.causal;
  in.options.scale = c.scale;
  in.options.enable_gqa = c.enable_gqa;
  in.options.dropout_p = c.dropout_p;
  if (c.dropout_p > 0) in.options.dropout_state = c.philox;

  ReferenceOptions ro;
  ro.mask = in.mask;
  ro.causal = c.causal;
  ro.scale = c.scale;
  ro.dropout_p = c.dropout_p;
  ro.philox = c.philox;
  in.ref = reference_attention(in.q, in.k, in.v, ro);
  return in;
}

bool CaseReport::ran_backend(SDPBackend b) const {
  return std::find(ran.begin(), ran.end(), b) != ran.end();
}

::testing::AssertionResult matches_reference(const Tensor& out, const Tensor& lse,
                                             const ReferenceResult& ref, DType dtype,
                                             bool unbatched) {
  const Shape out_shape = unbatched ? Shape{ref.heads_q, ref.q_len, ref.head_dim_v}
                                    : Shape{ref.batch, ref.heads_q, ref.q_len, ref.head_dim_v};
  const Shape lse_shape =
      unbatched ? Shape{ref.heads_q, ref.q_len} : Shape{ref.batch, ref.heads_q, ref.q_len};
  if (!out.defined()) return ::testing::AssertionFailure() << "out is undefined";
  if (out.sizes() != out_shape) {
    return ::testing::AssertionFailure() << "out shape " << shape_str(out.sizes())
                                         << ", expected " << shape_str(out_shape);
  }
  if (out.dtype() != dtype) {
    return ::testing::AssertionFailure() << "out dtype " << dtype_name(out.dtype())
                                         << ", expected " << dtype_name(dtype);
  }
  if (!out.is_contiguous()) {
    return ::testing::AssertionFailure() << "out is not contiguous (documented contiguous): "
                                         << shape_str(out.strides());
  }
  if (!lse.defined()) return ::testing::AssertionFailure() << "lse is undefined";
  if (lse.sizes() != lse_shape || lse.dtype() != DType::kFloat32) {
    return ::testing::AssertionFailure() << "lse is " << lse.describe() << ", expected "
                                         << shape_str(lse_shape) << " float32";
  }
  const Tolerance tol = tolerance_for(dtype);
  const std::vector<double> o = to_doubles(out);
  const std::vector<double> l = to_doubles(lse);
  const int64_t ev = ref.head_dim_v;

  double max_ref = 0.0;
  for (double x : ref.out) max_ref = std::max(max_ref, std::fabs(x));
  const double denom = std::max(max_ref, 1e-30);
  double worst = -1.0;
  int64_t worst_at = -1;
  for (int64_t n = 0; n < static_cast<int64_t>(o.size()); ++n) {
    const bool masked = ev > 0 && ref.fully_masked[n / ev];
    if (masked) {
      if (o[n] != 0.0) {
        return ::testing::AssertionFailure()
               << "out" << index_str(out_shape, n) << " = " << o[n]
               << " in a fully masked row, expected exactly 0";
      }
      continue;
    }
    const double err = std::isnan(o[n]) ? kInf : std::fabs(o[n] - ref.out[n]) / denom;
    if (err > worst) {
      worst = err;
      worst_at = n;
    }
  }
  if (std::getenv("SDPA_TEST_VERBOSE") != nullptr) {
    double lse_worst = 0.0;
    for (int64_t n = 0; n < static_cast<int64_t>(l.size()); ++n) {
      if (!ref.fully_masked[n]) lse_worst = std::max(lse_worst, std::fabs(l[n] - ref.lse[n]));
    }
    std::cout << "[ error    ] " << dtype_name(dtype) << " out " << worst << " (tol "
              << tol.out_rel << ") lse " << lse_worst << "\n";
  }
  if (worst > tol.out_rel) {
    return ::testing::AssertionFailure()
           << "out: max |out - ref| / max|ref| = " << worst << " > " << tol.out_rel << " at "
           << index_str(out_shape, worst_at) << " (got " << o[worst_at] << ", expected "
           << ref.out[worst_at] << ", max|ref| = " << max_ref << ")";
  }
  for (int64_t n = 0; n < static_cast<int64_t>(l.size()); ++n) {
    if (ref.fully_masked[n]) {
      if (!(std::isinf(l[n]) && l[n] < 0)) {
        return ::testing::AssertionFailure() << "lse" << index_str(lse_shape, n) << " = " << l[n]
                                             << " in a fully masked row, expected -inf";
      }
      continue;
    }
    const double bound = tol.lse_abs + tol.lse_rel * std::fabs(ref.lse[n]);
    if (!(std::fabs(l[n] - ref.lse[n]) <= bound)) {
      return ::testing::AssertionFailure()
             << "lse" << index_str(lse_shape, n) << " = " << l[n] << ", expected " << ref.lse[n]
             << " (|error| " << std::fabs(l[n] - ref.lse[n]) << " > " << bound << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<SDPBackend> all_backends() { return default_priority_order(); }

CaseReport check_case(const Case& c) {
  CaseInputs in;
  try {
    in = make_inputs(c);
  } catch (const std::exception& e) {
    ADD_FAILURE() << c.describe() << ": building the inputs threw: " << e.what();
    return {};
  }
  return check_inputs(in, c.dtype, c.unbatched, c.describe());
}

CaseReport check_inputs(const CaseInputs& in, DType dtype, bool unbatched,
                        const std::string& what) {
  CaseReport report;
  for (SDPBackend backend : all_backends()) {
    sdpa_kernel guard(backend);
    AttentionParams params;
    try {
      params = make_params(in.q, in.k, in.v, in.options);
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": make_params threw: " << e.what();
      return report;
    }
    Reasons reasons;
    if (!can_use(backend, params, &reasons)) {
      std::string why;
      for (const auto& r : reasons.items) why += (why.empty() ? "" : "; ") + r;
      report.not_supported[backend] = why;
      EXPECT_FALSE(reasons.items.empty())
          << backend_name(backend) << " refused " << what << " without a reason";
      // "Supported" and "ran" must agree: the guarded call must refuse too.
      EXPECT_THROW(scaled_dot_product_attention_with_lse(in.q, in.k, in.v, in.options), Error)
          << backend_name(backend) << " reports not supported but ran " << what;
      continue;
    }
    AttentionResult result;
    try {
      result = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, in.options);
    } catch (const std::exception& e) {
      ADD_FAILURE() << backend_name(backend) << " can_use() but threw on " << what << ": "
                    << e.what();
      continue;
    }
    report.ran.push_back(backend);
    EXPECT_EQ(result.backend, backend) << what;
    EXPECT_TRUE(matches_reference(result.out, result.lse, in.ref, dtype, unbatched))
        << backend_name(backend) << " on " << what;
  }
  return report;
}

void SweepTally::add(const CaseReport& report) {
  for (SDPBackend b : report.ran) ++ran[b];
  for (const auto& [b, why] : report.not_supported) {
    ++skipped[b];
    if (!example_reason.count(b)) example_reason[b] = why;
  }
}

void SweepTally::print(const std::string& title) const {
  std::cout << "[ sweep    ] " << title << "\n";
  for (SDPBackend b : all_backends()) {
    const int r = ran.count(b) ? ran.at(b) : 0;
    const int s = skipped.count(b) ? skipped.at(b) : 0;
    std::cout << "[ sweep    ]   " << backend_name(b) << ": ran " << r << ", not supported " << s;
    if (s) std::cout << " (e.g. " << example_reason.at(b) << ")";
    std::cout << "\n";
  }
}

}  // namespace sdpa::test
