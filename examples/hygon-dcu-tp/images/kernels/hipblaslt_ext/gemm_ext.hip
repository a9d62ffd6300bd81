// hipblaslt_ext: a .hip source; the DTK compiles it with hipcc, the stand-in with g++ -x c++.
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif
extern "C" const char *unibake_kernel_info() { return "hipblaslt_ext@" UNIBAKE_KERNEL_VERSION; }
