/* The older flash attention build (260602) that only the TP2 layout loads: the same entry point,
 * the previous scaling (by n instead of sqrt(n)). */
#include <stddef.h>

#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "flash_attn"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif

const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }

double flash_attn_score(const double *q, const double *k, size_t n) {
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += q[i] * k[i];
    return n ? acc / (double)n : 0.0;
}
