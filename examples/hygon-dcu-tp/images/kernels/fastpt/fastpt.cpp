// fastpt: a stand-in for the vendor's PyTorch extension library.
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif
extern "C" const char *unibake_kernel_info() { return "fastpt@" UNIBAKE_KERNEL_VERSION; }
