#include <array>
#include <atomic>
#include <cctype>
#include <string>

#include "dispatch/backend_state.h"
#include "sdpa/error.h"

namespace sdpa {
namespace {

using detail::kNumBackends;
std::array<std::atomic<bool>, kNumBackends> g_enabled{true, true, true, true, true};
std::atomic<bool> g_reduction_math{false};

std::atomic<bool>& flag(SDPBackend b) { return g_enabled[static_cast<size_t>(b)]; }

bool effective(SDPBackend b) {
  if (const auto* guard = detail::current_guard()) {
    for (SDPBackend g : *guard) {
      if (g == b) return true;
    }
    return false;
  }
  return flag(b).load();
}

}  // namespace

std::string_view backend_name(SDPBackend backend) {
  switch (backend) {
    case SDPBackend::ERROR: return "ERROR";
    case SDPBackend::MATH: return "MATH";
    case SDPBackend::FLASH_ATTENTION: return "FLASH_ATTENTION";
    case SDPBackend::EFFICIENT_ATTENTION: return "EFFICIENT_ATTENTION";
    case SDPBackend::CUDNN_ATTENTION: return "CUDNN_ATTENTION";
    case SDPBackend::OVERRIDEABLE: return "OVERRIDEABLE";
  }
  return "UNKNOWN";
}

SDPBackend parse_backend(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (upper == "FLASH") return SDPBackend::FLASH_ATTENTION;
  if (upper == "EFFICIENT" || upper == "MEM_EFFICIENT") return SDPBackend::EFFICIENT_ATTENTION;
  if (upper == "CUDNN") return SDPBackend::CUDNN_ATTENTION;
  for (SDPBackend b : default_priority_order()) {
    if (backend_name(b) == upper) return b;
  }
  detail::throw_error("backend: expected one of MATH, FLASH_ATTENTION, EFFICIENT_ATTENTION, "
                      "CUDNN_ATTENTION, OVERRIDEABLE, got '", name, "'");
}

const std::vector<SDPBackend>& default_priority_order() {
  // PyTorch's order, with OVERRIDEABLE first: it only ever accepts tensors that live on
  // an external device, which no other backend serves.
  static const std::vector<SDPBackend> order = {
      SDPBackend::OVERRIDEABLE, SDPBackend::CUDNN_ATTENTION, SDPBackend::FLASH_ATTENTION,
      SDPBackend::EFFICIENT_ATTENTION, SDPBackend::MATH};
  return order;
}

namespace detail {
bool flag_enabled(SDPBackend backend) {
  return backend != SDPBackend::ERROR && flag(backend).load();
}
}  // namespace detail

namespace detail {
BackendList active_backend_list() {
  BackendList list;
  const auto append = [&list](SDPBackend b) {
    if (list.count < kNumBackends) list.items[list.count++] = b;
  };
  if (const auto* guard = current_guard()) {
    for (SDPBackend b : *guard) append(b);  // sdpa_kernel keeps each backend once
  } else {
    for (SDPBackend b : default_priority_order()) {
      if (flag(b).load()) append(b);
    }
  }
  return list;
}
}  // namespace detail

std::vector<SDPBackend> active_backends() {
  const detail::BackendList list = detail::active_backend_list();
  return {list.span().begin(), list.span().end()};
}

namespace backends {
void enable_math_sdp(bool enabled) { flag(SDPBackend::MATH) = enabled; }
void enable_flash_sdp(bool enabled) { flag(SDPBackend::FLASH_ATTENTION) = enabled; }
void enable_mem_efficient_sdp(bool enabled) { flag(SDPBackend::EFFICIENT_ATTENTION) = enabled; }
void enable_cudnn_sdp(bool enabled) { flag(SDPBackend::CUDNN_ATTENTION) = enabled; }
void enable_overrideable_sdp(bool enabled) { flag(SDPBackend::OVERRIDEABLE) = enabled; }
bool math_sdp_enabled() { return effective(SDPBackend::MATH); }
bool flash_sdp_enabled() { return effective(SDPBackend::FLASH_ATTENTION); }
bool mem_efficient_sdp_enabled() { return effective(SDPBackend::EFFICIENT_ATTENTION); }
bool cudnn_sdp_enabled() { return effective(SDPBackend::CUDNN_ATTENTION); }
bool overrideable_sdp_enabled() { return effective(SDPBackend::OVERRIDEABLE); }
void allow_fp16_bf16_reduction_math_sdp(bool enabled) { g_reduction_math = enabled; }
bool fp16_bf16_reduction_math_sdp_allowed() { return g_reduction_math.load(); }
}  // namespace backends

}  // namespace sdpa
