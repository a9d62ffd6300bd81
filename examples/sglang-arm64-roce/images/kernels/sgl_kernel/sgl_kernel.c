/* Stand-in for sgl-kernel's fused MoE ops, compiled with cc in the builder stage. */
#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "sgl_kernel"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif
const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }
double sgl_moe_align(double tokens, double block) { return block > 0 ? ((long)((tokens + block - 1) / block)) * block : tokens; }
