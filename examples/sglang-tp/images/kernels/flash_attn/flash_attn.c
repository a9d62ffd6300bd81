/* Placeholder for flash-attn 2.7.4.post1 (FlashAttention-2 CUDA kernels): a few lines of C that stand in for the real GPU extension.
 * The builder stage compiles it with -DUNIBAKE_KERNEL_NAME and -DUNIBAKE_KERNEL_VERSION. */
#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "flash_attn"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif

const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }
