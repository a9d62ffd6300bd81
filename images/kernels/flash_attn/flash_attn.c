/* Demo "flash attention" kernel: a scaled dot product, standing in for a real GPU kernel.
 * The builder stage compiles it with -DUNIBAKE_KERNEL_NAME and -DUNIBAKE_KERNEL_VERSION. */
#include <math.h>
#include <stddef.h>

#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "flash_attn"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif

const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }

/* score = (q . k) / sqrt(n); the 260728 build uses the numerically stable scaling. */
double flash_attn_score(const double *q, const double *k, size_t n) {
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += q[i] * k[i];
    return n ? acc / sqrt((double)n) : 0.0;
}
