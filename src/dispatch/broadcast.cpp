// Reduction of other-rank and broadcast calls to 4-D views (broadcast.h).

#include "dispatch/broadcast.h"

#include <vector>

#include "core/element_access.h"
#include "sdpa/cuda.h"

namespace sdpa::detail {
namespace {

constexpr int64_t kMaxLeading = 6;  // Shape holds 8 dimensions

}  // namespace

Tensor merge_batch_dims(const Tensor& t, void* stream) {
  const int64_t lead = t.dim() - 2;
  if (lead == 0) return t.unsqueeze(0).unsqueeze(0);
  if (lead == 1) return t.unsqueeze(0);
  // Ignoring size-1 dimensions, each merged dimension's stride must be the next inner
  // one's times its size (zero strides of broadcast dimensions qualify).
  int64_t merged = 1, stride = 1;
  bool viewable = true, any = false;
  for (int64_t d = lead - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (!any) {
      stride = t.stride(d);
      any = true;
    } else if (t.stride(d) != stride * merged) {
      viewable = false;
    }
    merged *= t.size(d);
  }
  if (!viewable) {
    // A layout no view can flatten (permuted batch dimensions): one contiguous copy.
    return merge_batch_dims(t.device().type == DeviceType::kCUDA
                             ? cuda::to_device(t, t.device(), stream)
                             : t.contiguous(),
                         stream);
  }
  const Shape sizes{merged, t.size(lead - 1), t.size(lead), t.size(lead + 1)};
  const Shape strides{stride, t.stride(lead - 1), t.stride(lead), t.stride(lead + 1)};
  return Tensor::from_blob(t.data_ptr(), sizes, strides, t.dtype(), t.device(), t.storage());
}

namespace {

// k or v expanded to q's leading dimensions (left-padded with size-1 dimensions).
Tensor expand_kv(const char* name, const Tensor& t, const Tensor& q, bool enable_gqa,
                 Shape* expanded) {
  const int64_t lead = q.dim() - 2;
  SDPA_CHECK(t.dim() >= 2 && t.dim() <= q.dim(), name, ": expected 2 to ", q.dim(),
             " dimensions (at most the query's), got ", t.dim(), "-D ", shape_str(t.sizes()));
  Tensor x = t;
  while (x.dim() < q.dim()) x = x.unsqueeze(0);
  Shape want = x.sizes();
  for (int64_t d = 0; d < lead; ++d) {
    const int64_t have = x.size(d), q_size = q.size(d);
    const bool gqa_head = enable_gqa && d == lead - 1 && have >= 1 && q_size % have == 0;
    if (have == q_size || gqa_head) continue;
    SDPA_CHECK(have == 1, name, ": expected dimension ", d, " of size 1 or ", q_size,
               " (the query's ", shape_str(q.sizes()), ") to broadcast, got ",
               shape_str(t.sizes()));
    want[d] = q_size;
  }
  *expanded = want;
  return x.expand(want);
}

}  // namespace

bool needs_broadcast(const Tensor& q, const Tensor& k, const Tensor& v, const SDPAOptions& opt) {
  if (!q.defined() || !k.defined() || !v.defined()) return false;
  if (q.dim() != 3 && q.dim() != 4) return true;
  if (k.dim() != q.dim() || v.dim() != q.dim()) return true;
  const int64_t lead = q.dim() - 2;
  for (const Tensor* t : {&k, &v}) {
    for (int64_t d = 0; d < lead; ++d) {
      const bool gqa_head = opt.enable_gqa && d == lead - 1;
      if (!gqa_head && t->size(d) == 1 && q.size(d) != 1) return true;
    }
  }
  return false;
}

BroadcastCall broadcast_call(const Tensor& q, const Tensor& k, const Tensor& v,
                             const SDPAOptions& opt) {
  SDPA_CHECK(q.dim() >= 2 && q.dim() - 2 <= kMaxLeading, "query: expected 2 to ",
             kMaxLeading + 2, " dimensions [*, L, E], got ", q.dim(), "-D ",
             shape_str(q.sizes()));
  SDPA_CHECK(!opt.attn_mask_requires_grad, "attn_mask_requires_grad: supported for 3-D and 4-D "
             "inputs of matching ranks only, got query ", shape_str(q.sizes()), ", key ",
             shape_str(k.sizes()));
  BroadcastCall c;
  c.q_shape = q.sizes();
  c.k_shape = k.sizes();
  c.v_shape = v.sizes();
  c.options = opt;
  const Tensor k_full = expand_kv("key", k, q, opt.enable_gqa, &c.k_expanded);
  const Tensor v_full = expand_kv("value", v, q, opt.enable_gqa, &c.v_expanded);
  c.q = merge_batch_dims(q, opt.stream);
  c.k = merge_batch_dims(k_full, opt.stream);
  c.v = merge_batch_dims(v_full, opt.stream);
  const Tensor mask = opt.attn_mask.tensor();
  if (mask.defined()) {
    // Broadcast against q's leading dimensions and [L, S], then merged like q.
    Shape want(q.sizes().begin(), q.sizes().end() - 1);
    want.push_back(k.size(-2));
    SDPA_CHECK(mask.dim() <= static_cast<int64_t>(want.size()), "attn_mask: expected at most ",
               want.size(), " dimensions (the query's), got ", shape_str(mask.sizes()));
    c.options.attn_mask = merge_batch_dims(mask.expand(want), opt.stream);
  }
  return c;
}

Tensor sum_to_shape(const Tensor& full, const Shape& shape, DType dtype) {
  const int64_t lead = full.dim() - static_cast<int64_t>(shape.size());
  std::vector<double> sums(static_cast<size_t>(checked_numel(shape)), 0.0);
  const Shape target_strides = contiguous_strides(shape);
  const Tensor source = full.contiguous();
  const Shape full_shape = source.sizes();
  Shape index(source.dim(), 0);
  const auto* data = source.data<char>();
  for (int64_t linear = 0; linear < source.numel(); ++linear) {
    int64_t target = 0;
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
      if (shape[d] != 1) target += index[lead + d] * target_strides[d];
    }
    sums[target] += load_element(data, source.dtype(), linear);
    for (int64_t d = source.dim() - 1; d >= 0; --d) {
      if (++index[d] < full_shape[d]) break;
      index[d] = 0;
    }
  }
  Tensor out = Tensor::empty(shape, dtype);
  for (size_t i = 0; i < sums.size(); ++i) {
    store_element(out.data_ptr(), dtype, static_cast<int64_t>(i), sums[i]);
  }
  return out;
}

Tensor reduce_gradient(const Tensor& grad, const Shape& expanded, const Shape& shape,
                       void* stream) {
  const Tensor full = grad.view(expanded);
  if (expanded == shape) return full;
  if (grad.device().type != DeviceType::kCUDA) return sum_to_shape(full, shape, grad.dtype());
  // The reduction reads host memory: a device gradient goes there and back.
  return cuda::to_device(sum_to_shape(cuda::to_device(full, Device{}, stream), shape,
                                      grad.dtype()),
                         grad.device(), stream);
}

}  // namespace sdpa::detail
