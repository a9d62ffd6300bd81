// Demo rotary-embedding kernel in C++, built by the builder image's second toolchain (g++) through
// build.run in profiles/product.yaml. It keeps a C entry point so that ctypes (and self-check) load it.
#include <cmath>
#include <cstddef>

#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif

namespace {
template <typename T> T rotate(T x, T y, T theta) { return x * std::cos(theta) - y * std::sin(theta); }
}  // namespace

extern "C" const char *unibake_kernel_info() { return "rope@" UNIBAKE_KERNEL_VERSION; }

extern "C" double rope_rotate(double x, double y, double theta) { return rotate(x, y, theta); }
