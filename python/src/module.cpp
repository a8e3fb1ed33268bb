// sdpa._C: the nanobind extension behind the `sdpa` package. Each family binds itself in
// its own file; this one assembles the module and maps sdpa::Error to Python.

#include "bindings.h"

NB_MODULE(_C, m) {
  namespace nb = nanobind;
  m.doc() = "Bindings of the sdpa C++ library (use the `sdpa` package, not this module).";
  // sdpa::Error (every invalid input) -> sdpa.Error carrying the C++ message: a ValueError
  // (what Python code expects of bad arguments) and a RuntimeError (what torch raises for
  // invalid SDPA input, and what torch code catches).
  nb::exception<sdpa::Error>(
      m, "Error", nb::make_tuple(nb::handle(PyExc_ValueError), nb::handle(PyExc_RuntimeError)));
  sdpa::python::bind_tensor(m);
  sdpa::python::bind_backend(m);
  sdpa::python::bind_bias(m);
  sdpa::python::bind_generator(m);
  sdpa::python::bind_attention(m);
  sdpa::python::bind_info(m);
  sdpa::python::bind_flex(m);
  sdpa::python::bind_torch(m);
  sdpa::python::bind_cuda(m);
  sdpa::python::bind_serving(m);
#ifdef SDPA_XLA_FFI
  // Without it sdpa/_jax.py reports that jax transformations need a rebuild.
  sdpa::python::bind_jax_ffi(m);
#endif
}
