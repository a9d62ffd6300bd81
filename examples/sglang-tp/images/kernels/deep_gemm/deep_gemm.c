/* Placeholder for DeepGEMM (FP8 GEMM kernels for Hopper): a few lines of C that stand in for the real GPU extension.
 * The builder stage compiles it with -DUNIBAKE_KERNEL_NAME and -DUNIBAKE_KERNEL_VERSION. */
#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "deep_gemm"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif

const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }

#ifdef DEEP_GEMM_ENABLE_FP8
int deep_gemm_fp8_enabled(void) { return 1; }
#else
int deep_gemm_fp8_enabled(void) { return 0; }
#endif
