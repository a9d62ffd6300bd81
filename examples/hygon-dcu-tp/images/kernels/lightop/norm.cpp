// lightop norm: a stand-in for the vendor's HIP kernel, with a C entry point.
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif
#define STR2(x) #x
#define STR(x) STR2(x)
#ifndef OFFLOAD_ARCH
#error "lightop is built for one DCU architecture: give -DOFFLOAD_ARCH=gfx..."
#endif
extern "C" const char *unibake_kernel_info() { return "lightop_" OP_NAME "@" UNIBAKE_KERNEL_VERSION; }
extern "C" int lightop_norm_arch() { return sizeof(STR(OFFLOAD_ARCH)); }
