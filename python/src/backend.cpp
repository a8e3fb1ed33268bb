// SDPBackend, the per-thread sdpa_kernel guard, process-wide enable flags and the CPU
// capability.

#include <memory>
#include <stdexcept>
#include <thread>

#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"

namespace sdpa::python {
namespace {

// Holds the C++ RAII guard between __enter__ and __exit__. The guard pushes onto a
// thread-local stack, so it must be opened and closed on the same thread, innermost first:
// sdpa/_kernel.py's context manager does both inside one `with` block. Closing it from
// another thread would pop that thread's stack, so that is refused.
class KernelGuard {
 public:
  KernelGuard(std::vector<SDPBackend> backends, bool set_priority)
      : backends_(std::move(backends)), set_priority_(set_priority) {}
  ~KernelGuard() {
    // Collected while still open on another thread: leak the guard rather than pop the
    // wrong thread's stack.
    if (guard_ && std::this_thread::get_id() != owner_) (void)guard_.release();
  }
  void enter() {
    if (guard_) throw nb::value_error("sdpa_kernel: this guard is already active");
    guard_ = std::make_unique<sdpa_kernel>(backends_, set_priority_);
    owner_ = std::this_thread::get_id();
  }
  void exit() {
    if (guard_ && std::this_thread::get_id() != owner_) {
      throw std::runtime_error("sdpa_kernel: a guard must be closed on the thread that "
                               "opened it");
    }
    guard_.reset();
  }
  bool active() const { return guard_ != nullptr; }

 private:
  std::vector<SDPBackend> backends_;
  bool set_priority_;
  std::unique_ptr<sdpa_kernel> guard_;
  std::thread::id owner_;
};

}  // namespace

void bind_backend(nb::module_& m) {
  nb::enum_<SDPBackend>(m, "SDPBackend",
                        "Attention backends; names and values are PyTorch's "
                        "torch.nn.attention.SDPBackend.")
      .value("ERROR", SDPBackend::ERROR)
      .value("MATH", SDPBackend::MATH)
      .value("FLASH_ATTENTION", SDPBackend::FLASH_ATTENTION)
      .value("EFFICIENT_ATTENTION", SDPBackend::EFFICIENT_ATTENTION)
      .value("CUDNN_ATTENTION", SDPBackend::CUDNN_ATTENTION)
      .value("OVERRIDEABLE", SDPBackend::OVERRIDEABLE);

  m.def("parse_backend", [](std::string_view name) { return parse_backend(name); },
        nb::arg("name"));
  m.def("backend_name", [](SDPBackend b) { return std::string(backend_name(b)); });
  m.def("default_priority_order", &default_priority_order);
  m.def("active_backends", &active_backends,
        "Backends the calling thread may use now, in the order they are tried.");

  m.def("sdpa_kernel_active", &sdpa_kernel_active,
        "Whether an sdpa_kernel guard is active on the calling thread.");

  nb::class_<KernelGuard>(m, "_KernelGuard")
      .def(nb::init<std::vector<SDPBackend>, bool>(), nb::arg("backends"),
           nb::arg("set_priority") = false)
      .def("enter", &KernelGuard::enter)
      .def("exit", &KernelGuard::exit)
      .def_prop_ro("active", &KernelGuard::active);

  m.def("enable_math_sdp", &backends::enable_math_sdp, nb::arg("enabled"));
  m.def("enable_flash_sdp", &backends::enable_flash_sdp, nb::arg("enabled"));
  m.def("enable_mem_efficient_sdp", &backends::enable_mem_efficient_sdp, nb::arg("enabled"));
  m.def("enable_cudnn_sdp", &backends::enable_cudnn_sdp, nb::arg("enabled"));
  m.def("enable_overrideable_sdp", &backends::enable_overrideable_sdp, nb::arg("enabled"));
  m.def("math_sdp_enabled", &backends::math_sdp_enabled);
  m.def("flash_sdp_enabled", &backends::flash_sdp_enabled);
  m.def("mem_efficient_sdp_enabled", &backends::mem_efficient_sdp_enabled);
  m.def("cudnn_sdp_enabled", &backends::cudnn_sdp_enabled);
  m.def("overrideable_sdp_enabled", &backends::overrideable_sdp_enabled);
  m.def("allow_fp16_bf16_reduction_math_sdp", &backends::allow_fp16_bf16_reduction_math_sdp,
        nb::arg("enabled"),
        "torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp: MATH computes float16 / "
        "bfloat16 forwards in their own dtype (every intermediate rounded to it) instead of "
        "float32. Process-wide; off by default.");
  m.def("fp16_bf16_reduction_math_sdp_allowed", &backends::fp16_bf16_reduction_math_sdp_allowed);

  m.def("get_cpu_capability", &backends::cpu::get_cpu_capability);
  m.def("detected_cpu_capability", &backends::cpu::detected_cpu_capability);
  m.def("amx_bf16_available", &backends::cpu::amx_bf16_available,
        "Whether bfloat16 products may run on Intel AMX tiles (CPU, OS permission, "
        "SDPA_DISABLE_AMX not 1); the FLASH kernels' bfloat16 calls use them at the AVX512 "
        "level.");
  m.def("set_cpu_capability",
        [](std::string_view capability) { backends::cpu::set_cpu_capability(capability); },
        nb::arg("capability"));
}

}  // namespace sdpa::python
