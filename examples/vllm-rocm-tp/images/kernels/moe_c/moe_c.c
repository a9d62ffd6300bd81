/* Placeholder for vLLM's _moe_C extension (MoE routing and alignment ops): a few lines of C that stand in for the real HIP extension.
 * The builder stage compiles it with -DUNIBAKE_KERNEL_NAME and -DUNIBAKE_KERNEL_VERSION. */
#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "moe_c"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif

const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }
