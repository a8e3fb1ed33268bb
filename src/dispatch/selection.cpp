// Backend selection: the first allowed backend, in priority order, whose checks pass.

#include <algorithm>
#include <sstream>

#include "dispatch/backend_impl.h"
#include "dispatch/backend_state.h"
#include "dispatch/lowering.h"
#include "sdpa/flex.h"

namespace sdpa {
namespace {

bool is_allowed(SDPBackend backend, const std::vector<SDPBackend>& active) {
  return std::find(active.begin(), active.end(), backend) != active.end();
}

std::string call_summary(const AttentionParams& p) {
  std::ostringstream os;
  os << (p.backward ? "backward of " : "") << "q [" << p.batch << ", " << p.num_heads_q << ", " << p.q_len << ", " << p.head_dim_qk
     << "], k/v [" << p.batch << ", " << p.num_heads_kv << ", " << p.kv_len << ", "
     << p.head_dim_qk << "/" << p.head_dim_vo << "] " << dtype_name(p.dtype) << " on "
     << device_name(p.device);
  return os.str();
}

}  // namespace

bool can_use(SDPBackend backend, const AttentionParams& params, Reasons* reasons) {
  Reasons quiet{false, {}};
  Reasons& r = reasons ? *reasons : quiet;
  if (backend == SDPBackend::ERROR) {
    r.add("ERROR is not a backend");
    return false;
  }
  bool ok = true;
  if (!detail::active_backend_list().contains(backend)) {
    r.add("disabled (not allowed by the active sdpa_kernel guard or enable flags)");
    ok = false;
    if (!r.collect) return false;
  }
  return detail::run_checks(detail::backend_impl(backend), params, r) && ok;
}

Explanation explain(const AttentionParams& params) {
  Explanation e;
  const std::vector<SDPBackend> active = active_backends();
  // Allowed backends first, in the order they would be tried, then the rest.
  std::vector<SDPBackend> order = active;
  for (SDPBackend b : default_priority_order()) {
    if (!is_allowed(b, order)) order.push_back(b);
  }
  for (SDPBackend b : order) {
    BackendVerdict v{b, is_allowed(b, active), false, {}, {}, {}};
    Reasons r;
    if (!v.allowed) r.add("disabled (not allowed by the active sdpa_kernel guard or enable flags)");
    v.supported = detail::run_checks(detail::backend_impl(b), params, r);
    v.reasons = std::move(r.items);
    if (params.bias) {
      const bool dense = params.bias->needs_materialization() ||
                         params.mask.dense_kind != DenseMaskKind::kNone;
      const bool native = (detail::backend_impl(b).native_bias || bias_stays_native(params)) &&
                          !params.bias->needs_materialization();
      v.bias_handling = std::string(native ? "native" : "materialized") +
                        (dense && native ? " (dense tensor)" : "") + ": " +
                        params.bias->describe();
    }
    if (const auto describe = detail::backend_impl(b).describe) v.lowering = describe(params);
    if (e.chosen == SDPBackend::ERROR && v.allowed && v.supported) e.chosen = b;
    e.verdicts.push_back(std::move(v));
  }
  if (params.mask.score_mod) e.flex += "score_mod:\n" + params.mask.score_mod->to_string();
  if (params.mask.block_mask) {
    const flex::BlockMask& m = *params.mask.block_mask;
    if (m.mask_mod) e.flex += "mask_mod:\n" + m.mask_mod->to_string();
    e.flex += m.to_string();
  }
  return e;
}

std::string Explanation::to_string() const {
  std::ostringstream os;
  os << "chosen: " << backend_name(chosen) << '\n';
  if (!flex.empty()) os << flex;
  for (const BackendVerdict& v : verdicts) {
    os << backend_name(v.backend);
    if (v.allowed && v.supported) {
      os << (v.backend == chosen ? ": supported (chosen)" : ": supported");
    } else {
      os << " is not supported because:";
      for (const std::string& reason : v.reasons) os << "\n  - " << reason;
    }
    if (!v.bias_handling.empty()) os << "\n  attn_mask: " << v.bias_handling;
    if (!v.lowering.empty()) {
      std::istringstream lines(v.lowering);
      for (std::string line; std::getline(lines, line);) os << "\n  | " << line;
    }
    os << '\n';
  }
  return os.str();
}

SDPBackend select_backend(const AttentionParams& params) {
  return detail::select_from(params, detail::active_backend_list().span());
}

namespace detail {

SDPBackend select_from(const AttentionParams& params, std::span<const SDPBackend> order) {
  Reasons quiet{false, {}};
  for (SDPBackend b : order) {
    if (run_checks(backend_impl(b), params, quiet)) return b;
  }
  throw Error("scaled_dot_product_attention: no backend can run " + call_summary(params) +
              "\n" + explain(params).to_string());
}

}  // namespace detail

}  // namespace sdpa
