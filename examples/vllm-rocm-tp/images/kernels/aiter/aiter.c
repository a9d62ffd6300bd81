/* Placeholder for AITER, AMD's AI Tensor Engine for ROCm (assembly and CK kernels): a few lines of C that stand in for the real HIP extension.
 * The builder stage compiles it with -DUNIBAKE_KERNEL_NAME and -DUNIBAKE_KERNEL_VERSION. */
#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "aiter"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif

const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }

#ifdef AITER_ASM_KERNELS
int aiter_asm_kernels_enabled(void) { return 1; }
#else
int aiter_asm_kernels_enabled(void) { return 0; }
#endif
