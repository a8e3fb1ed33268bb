// A Python interpreter that carries ThreadSanitizer's runtime (scripts/tsan.sh): the
// runtime cannot be preloaded into the uninstrumented system interpreter, and a
// TSan-instrumented extension module needs it in the executable. Linked with clang++ so
// that the C++ parts of the runtime (operator new, __cxa_guard_*) are intercepted too.
#include <Python.h>

int main(int argc, char** argv) { return Py_BytesMain(argc, argv); }
