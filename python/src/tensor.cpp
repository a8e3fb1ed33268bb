// sdpa._C.Tensor and the DLPack capsule protocol, both directions, zero-copy.
//
// Import: a producer's __dlpack__() returns a PyCapsule named "dltensor" (DLManagedTensor,
// DLPack < 1.0) or "dltensor_versioned" (DLManagedTensorVersioned, DLPack >= 1.0). The
// consumer renames it "used_dltensor" / "used_dltensor_versioned" when it takes ownership,
// so the capsule's destructor no longer frees it; from then on the deleter is ours to call.
// Export: sdpa._C.Tensor.__dlpack__ hands out a fresh capsule per call whose destructor
// frees the DLManagedTensor only while it is still unconsumed.

#include <dlpack/dlpack.h>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "dlpack_versioned.h"
#include "sdpa/cuda.h"
#include "sdpa/dlpack.h"

namespace sdpa::python {
namespace {

constexpr const char* kLegacyName = "dltensor";
constexpr const char* kLegacyUsedName = "used_dltensor";
constexpr const char* kVersionedName = "dltensor_versioned";
constexpr const char* kVersionedUsedName = "used_dltensor_versioned";

// A legacy DLManagedTensor that owns a versioned one, so sdpa::from_dlpack (which takes
// DLManagedTensor*) can import DLPack 1.0 capsules. The shape/strides arrays stay those
// of the versioned tensor, which lives as long as this wrapper.
DLManagedTensor* wrap_versioned(DLManagedTensorVersioned* versioned) {
  auto* legacy = new DLManagedTensor{};
  legacy->dl_tensor = versioned->dl_tensor;
  legacy->manager_ctx = versioned;
  legacy->deleter = [](DLManagedTensor* self) {
    auto* v = static_cast<DLManagedTensorVersioned*>(self->manager_ctx);
    if (v->deleter) v->deleter(v);
    delete self;
  };
  return legacy;
}

// Capsule destructors: free the tensor only if no consumer took it (name unchanged).
// They may run with an exception pending, which must survive.
void legacy_capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kLegacyName)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kLegacyName));
  if (managed != nullptr && managed->deleter) managed->deleter(managed);
  PyErr_Restore(type, value, traceback);
}

void versioned_capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kVersionedName)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed =
      static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, kVersionedName));
  if (managed != nullptr && managed->deleter) managed->deleter(managed);
  PyErr_Restore(type, value, traceback);
}

std::string python_type_name(nb::handle obj) {
  return nb::cast<std::string>(nb::handle(Py_TYPE(obj.ptr())).attr("__qualname__"));
}

// The attribute of an sdpa.Tensor that an sdpa call wrote on a CUDA device: the
// cudaStream_t (an int) its values were written on.
constexpr const char* kStreamAttr = "_stream";

// DLPack's stream argument for CUDA: None and 1 name the legacy default stream (handle 0),
// 2 the per-thread default stream (its handle is 2), -1 asks for no synchronization,
// anything else is a cudaStream_t. Makes what the producing stream wrote visible to the
// consumer's stream. sdpa has no events to order one stream after another, so the host
// waits for the producing stream instead (correct for every consumer stream, at the cost
// of a host sync); nothing waits when both streams are the same.
void make_visible(nb::handle self, nb::handle stream) {
  nb::object producer = nb::getattr(self, kStreamAttr, nb::none());
  if (producer.is_none()) return;  // imported, not written by sdpa: the producer's business
  if (!stream.is_none() && !PyLong_Check(stream.ptr())) {
    throw nb::type_error("sdpa.Tensor.__dlpack__: stream must be an int or None");
  }
  const intptr_t consumer = stream.is_none() ? 1 : nb::cast<intptr_t>(stream);
  if (consumer == -1) return;
  const uintptr_t consumer_handle = consumer == 1 ? 0 : static_cast<uintptr_t>(consumer);
  const auto producer_handle = nb::cast<uintptr_t>(producer);
  if (consumer_handle == producer_handle) return;
  nb::gil_scoped_release release;
  cuda::synchronize(reinterpret_cast<cuda::Stream>(producer_handle));
}

// Tensor.__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None).
nb::object tensor_dlpack(nb::handle self_obj, nb::handle stream,
                         std::optional<std::tuple<int, int>> max_version,
                         std::optional<std::tuple<int, int>> dl_device,
                         std::optional<bool> copy) {
  const Tensor& self = nb::cast<const Tensor&>(self_obj);
  // CPU memory needs no stream synchronization.
  if (self.device().type == DeviceType::kCUDA) make_visible(self_obj, stream);
  if (dl_device) {
    const auto [type, index] = *dl_device;
    if (type != static_cast<int>(self.device().type) || index != self.device().index) {
      throw nb::buffer_error("sdpa.Tensor.__dlpack__: cannot export to another device");
    }
  }
  Tensor exported = (copy && *copy) ? self.clone() : self;
  if (max_version && std::get<0>(*max_version) >= static_cast<int>(kDLPackMajor)) {
    DLManagedTensorVersioned* v = export_versioned(std::move(exported));
    PyObject* cap = PyCapsule_New(v, kVersionedName, versioned_capsule_destructor);
    if (cap == nullptr) {
      v->deleter(v);
      throw nb::python_error();
    }
    return nb::steal(cap);
  }
  return legacy_capsule(std::move(exported));
}

std::vector<int64_t> to_vector(const Shape& s) { return {s.begin(), s.end()}; }

}  // namespace

DLManagedTensorVersioned* export_versioned(Tensor tensor) {
  // sdpa::to_dlpack's legacy export owns the tensor; the versioned struct owns that.
  DLManagedTensor* legacy = to_dlpack(tensor);
  auto* v = new DLManagedTensorVersioned{};
  v->version = {kDLPackMajor, 0};
  v->manager_ctx = legacy;
  v->flags = 0;
  v->dl_tensor = legacy->dl_tensor;
  v->deleter = [](DLManagedTensorVersioned* self) {
    auto* l = static_cast<DLManagedTensor*>(self->manager_ctx);
    if (l->deleter) l->deleter(l);
    delete self;
  };
  return v;
}

namespace {

// sdpa::from_dlpack's errors with the argument named first (its own messages name no
// argument).
Tensor from_dlpack_named(DLManagedTensor* managed, const char* arg) {
  try {
    return from_dlpack(managed);
  } catch (const Error& e) {
    throw Error(std::string(arg) + ": " + e.what());
  }
}

}  // namespace

Tensor import_tensor(nb::handle obj, const char* arg) {
  if (nb::isinstance<Tensor>(obj)) return nb::cast<const Tensor&>(obj);
  PyObject* cap = obj.ptr();
  if (PyCapsule_IsValid(cap, kVersionedName)) {
    auto* v = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, kVersionedName));
    // Consumed from here on: the deleter is ours to call, whatever happens next.
    PyCapsule_SetName(cap, kVersionedUsedName);
    if (v->version.major != kDLPackMajor) {
      const uint32_t major = v->version.major;
      if (v->deleter) v->deleter(v);
      throw nb::value_error((std::string(arg) + ": expected DLPack major version 1, got " +
                             std::to_string(major)).c_str());
    }
    return from_dlpack_named(wrap_versioned(v), arg);
  }
  if (PyCapsule_IsValid(cap, kLegacyName)) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kLegacyName));
    PyCapsule_SetName(cap, kLegacyUsedName);
    return from_dlpack_named(managed, arg);
  }
  if (PyCapsule_CheckExact(cap)) {
    throw nb::value_error((std::string(arg) + ": expected an unconsumed DLPack capsule, got "
                           "one named '" + (PyCapsule_GetName(cap) ? PyCapsule_GetName(cap) : "") +
                           "' (a capsule can be imported only once)").c_str());
  }
  throw nb::type_error((std::string(arg) + ": expected an array with __dlpack__ (numpy, "
                        "torch, jax, ...), got " + python_type_name(obj)).c_str());
}

Tensor import_array(nb::handle obj, const char* arg, uintptr_t stream) {
  // Capsules (sdpa.torch exports torch tensors itself) skip the Python helper's call.
  if (nb::isinstance<Tensor>(obj) || PyCapsule_CheckExact(obj.ptr())) {
    // An earlier call's CUDA result, read on this call's stream.
    if (nb::isinstance<Tensor>(obj) &&
        nb::cast<const Tensor&>(obj).device().type == DeviceType::kCUDA) {
      make_visible(obj, nb::int_(stream == 0 ? uintptr_t{1} : stream));
    }
    return import_tensor(obj, arg);
  }
  // sdpa._convert.to_capsule, looked up once. A plain pointer guarded by the GIL rather
  // than a function-local static: a static's init lock, held across an import that drops
  // the GIL, can deadlock against a second thread. Never released (the interpreter may be
  // gone when statics are destroyed).
  static PyObject* to_capsule = nullptr;
  if (to_capsule == nullptr) {
    nb::object f = nb::module_::import_("sdpa._convert").attr("to_capsule");
    if (to_capsule == nullptr) to_capsule = f.release().ptr();
  }
  nb::object capsule = stream == 0 ? nb::handle(to_capsule)(obj, arg)
                                   : nb::handle(to_capsule)(obj, arg, stream);
  return import_tensor(capsule, arg);
}

nb::object export_tensor(Tensor tensor, uintptr_t stream) {
  const bool on_cuda = tensor.device().type == DeviceType::kCUDA;
  nb::object result = nb::cast(std::move(tensor));
  if (on_cuda) nb::setattr(result, kStreamAttr, nb::int_(stream));
  return result;
}

nb::object legacy_capsule(Tensor tensor) {
  DLManagedTensor* legacy = to_dlpack(tensor);
  PyObject* cap = PyCapsule_New(legacy, kLegacyName, legacy_capsule_destructor);
  if (cap == nullptr) {
    legacy->deleter(legacy);
    throw nb::python_error();
  }
  return nb::steal(cap);
}

void bind_tensor(nb::module_& m) {
  // dynamic_attr: a CUDA result records the stream it was written on (kStreamAttr).
  nb::class_<Tensor>(m, "Tensor", nb::dynamic_attr(),
      "A strided view of memory owned by the sdpa library or imported zero-copy through "
      "DLPack. Convert with numpy.from_dlpack(t), torch.from_dlpack(t) or t.numpy(). "
      "A CUDA result's __dlpack__(stream=s) makes the values visible on stream s (the "
      "host waits for the stream the call ran on, unless that is s).")
      .def_static("from_dlpack", [](nb::handle obj) { return import_array(obj, "tensor"); },
                  nb::arg("array"),
                  "Wraps an array with __dlpack__ (or a DLPack capsule) without copying.")
      .def_prop_ro("shape", [](const Tensor& t) { return nb::tuple(nb::cast(to_vector(t.sizes()))); })
      .def_prop_ro("strides", [](const Tensor& t) { return nb::tuple(nb::cast(to_vector(t.strides()))); },
                   "Strides in elements.")
      .def_prop_ro("ndim", &Tensor::dim)
      .def_prop_ro("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def_prop_ro("device", [](const Tensor& t) { return device_name(t.device()); })
      .def_prop_ro("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); })
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("__dlpack__", &tensor_dlpack, nb::kw_only(), nb::arg("stream") = nb::none(),
           nb::arg("max_version") = nb::none(), nb::arg("dl_device") = nb::none(),
           nb::arg("copy") = nb::none())
      .def("__dlpack_device__", [](const Tensor& t) {
        return std::make_tuple(static_cast<int>(t.device().type), t.device().index);
      })
      .def("numpy", [](nb::handle self) {
        return nb::module_::import_("numpy").attr("from_dlpack")(self);
      }, "Returns a numpy array sharing this tensor's memory.")
      .def("__array__", [](nb::handle self, nb::handle dtype, nb::handle copy) {
        nb::object np = nb::module_::import_("numpy");
        nb::object a = np.attr("from_dlpack")(self);
        if (!dtype.is_none()) a = a.attr("astype")(dtype);
        if (!copy.is_none() && nb::cast<bool>(copy)) a = a.attr("copy")();
        return a;
      }, nb::arg("dtype") = nb::none(), nb::arg("copy") = nb::none())
      .def("__repr__", [](const Tensor& t) { return "sdpa.Tensor(" + t.describe() + ")"; });
}

}  // namespace sdpa::python
