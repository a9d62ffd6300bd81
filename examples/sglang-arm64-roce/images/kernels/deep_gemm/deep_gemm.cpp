// Stand-in for DeepGEMM: an FP8 GEMM scale helper with a C entry point.
#include <cmath>
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif
extern "C" const char *unibake_kernel_info() { return "deep_gemm@" UNIBAKE_KERNEL_VERSION; }
extern "C" double deep_gemm_fp8_scale(double amax) { return amax > 0 ? 448.0 / amax : 1.0; }
