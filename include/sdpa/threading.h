#pragma once
// How many threads the library's CPU kernels use.

namespace sdpa {

/// Sets the most threads (>= 1) one library call uses, for every calling thread of the
/// process (as torch.set_num_threads). A parallel region then runs on at most n threads,
/// fewer when it has fewer work items or too little work to repay waking threads, and on
/// the calling thread alone below the work grain (docs/design.md, "Threading"). Until this
/// is called the limit is OpenMP's for the calling thread: omp_set_num_threads, else
/// OMP_NUM_THREADS, else the processors available. Throws sdpa::Error when n < 1.
void set_num_threads(int n);

/// The most threads a library call started on the calling thread uses (>= 1).
int get_num_threads();

}  // namespace sdpa
