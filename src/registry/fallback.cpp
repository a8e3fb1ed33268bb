// The CPU fallback: an op an external backend has no kernel for runs on the host, with
// its tensors copied there and back; counted per op and warned about once.

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "registry/table.h"

namespace sdpa::registry {
namespace {

bool strict_backends() {
  const char* s = std::getenv("SDPA_STRICT_BACKENDS");
  return s != nullptr && *s != '\0' && std::strcmp(s, "0") != 0;
}

}  // namespace

void fallback(Registry& r, int op, int key, OpCall& call, Device device) {
  const OpEntry& e = r.ops[op];
  const std::string where = key_label(r, key, device);
  SDPA_CHECK(!strict_backends(), e.name, ": ", where, " has no kernel for it and "
             "SDPA_STRICT_BACKENDS=1 forbids the CPU fallback (unset it to run the op on CPU, "
             "with its tensors copied to host and back)");
  r.fallbacks[op].fetch_add(1);
  if (!r.warned[op].exchange(true)) {
    std::fprintf(stderr,
                 "sdpa: warning: %s has no kernel for %s; running it on CPU (tensors copied to "
                 "host and back). SDPA_STRICT_BACKENDS=1 makes this an error. (Shown once per "
                 "op.)\n",
                 where.c_str(), e.name.c_str());
  }

  AttentionParams host_params;
  OpCall host;
  if (call.params) {
    host_params = params_to_host(*call.params);
    host.params = &host_params;
  }
  host.args.resize(call.args.size());
  for (size_t i = 0; i < call.args.size(); ++i) {
    const Tensor& t = call.args[i];
    bool is_write = false;
    for (int w : e.write_args) is_write |= w == static_cast<int>(i);
    // Outs are write-only: fresh host tensors of their shape; inputs are copied.
    host.args[i] = is_write ? (t.defined() ? Tensor::empty(t.sizes(), t.dtype()) : Tensor())
                            : to_host(t);
  }
  const std::vector<TensorMeta> host_metas =
      op_decl(static_cast<OpId>(op)).meta(host);
  execute(r, op, kCpuKey, host, host_metas);
  call.backend = host.backend;

  if (e.schema.is_out()) {
    for (int w : e.write_args) copy(call.args[w], host.args[w]);
    call.returns.clear();
    for (int w : e.write_args) call.returns.push_back(call.args[w]);
  } else if (e.schema.is_inplace()) {
    copy(call.params->q, host_params.q);
    call.returns = {call.params->q};
  } else {
    call.returns.clear();
    for (const Tensor& t : host.returns) call.returns.push_back(to_device(t, device));
    call.tensor_list.clear();
    for (const Tensor& t : host.tensor_list) call.tensor_list.push_back(to_device(t, device));
  }
}

}  // namespace sdpa::registry

namespace sdpa {

std::map<std::string, int64_t> fallback_counts() {
  auto& r = registry::raw();
  std::map<std::string, int64_t> counts;
  for (size_t op = 0; op < r.ops.size(); ++op) {
    if (const int64_t n = r.fallbacks[op].load()) counts[r.ops[op].name] = n;
  }
  return counts;
}

void reset_fallback_counts() {
  auto& r = registry::raw();
  for (auto& n : r.fallbacks) n = 0;
  for (auto& w : r.warned) w = false;
}

}  // namespace sdpa
