/* Demo RMS-norm kernel: normalises a vector in place and returns its RMS. */
#include <math.h>
#include <stddef.h>

#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "rmsnorm"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif

const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }

double rmsnorm_inplace(double *x, size_t n, double eps) {
    double sq = 0.0;
    for (size_t i = 0; i < n; i++) sq += x[i] * x[i];
    double rms = sqrt(sq / (double)(n ? n : 1) + eps);
    for (size_t i = 0; i < n; i++) x[i] /= rms;
    return rms;
}
