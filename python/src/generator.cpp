// Dropout randomness (Generator, manual_seed) and the determinism flag.

#include "bindings.h"

namespace sdpa::python {

void bind_generator(nb::module_& m) {
  nb::class_<Generator>(m, "Generator",
                        "A seedable Philox dropout generator (torch.Generator's role). Each "
                        "call with dropout takes (seed, offset) and advances the offset.")
      .def(nb::init<uint64_t>(), nb::arg("seed") = 67280421310721ull)
      .def("manual_seed", [](Generator& g, uint64_t seed) -> Generator& {
        g.manual_seed(seed);
        return g;
      }, nb::arg("seed"), nb::rv_policy::reference, "Resets to `seed` with offset 0.")
      .def("initial_seed", &Generator::initial_seed)
      .def("next_state", [](Generator& g) {
        const PhiloxState s = g.next();
        return nb::make_tuple(s.seed, s.offset);
      }, "Returns the (seed, offset) the next dropout call would use, and advances.");

  m.def("default_generator", &default_generator, nb::rv_policy::reference,
        "The process-wide generator used when a call names none.");
  m.def("manual_seed", &manual_seed, nb::arg("seed"), "Seeds the default generator.");
  m.def("use_deterministic_algorithms", &use_deterministic_algorithms, nb::arg("enabled"));
  m.def("are_deterministic_algorithms_enabled", &are_deterministic_algorithms_enabled);
}

}  // namespace sdpa::python
