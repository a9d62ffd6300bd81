/* Placeholder for vLLM's custom all-reduce, loaded only by the multi-GPU layouts (tp2, tp4): a few lines of C that stand in for the real HIP extension.
 * The builder stage compiles it with -DUNIBAKE_KERNEL_NAME and -DUNIBAKE_KERNEL_VERSION. */
#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "custom_ar"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif

const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }
