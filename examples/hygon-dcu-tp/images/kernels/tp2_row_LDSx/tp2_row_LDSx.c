/* tp2_row_LDSx: a stand-in for the vendor's DCU kernel, compiled with cc. */
#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "tp2_row_LDSx"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif
const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }
int tp2_row_lds_bytes(void) { return 65536; }
