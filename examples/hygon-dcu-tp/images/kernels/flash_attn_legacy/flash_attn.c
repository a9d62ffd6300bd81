/* flash_attn_legacy: a stand-in for the vendor's DCU kernel, compiled with cc. */
#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "flash_attn"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif
const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }
double flash_attn_scale(double d) { return d > 0 ? 1.0 / (2.0 * d) : 0.0; }
