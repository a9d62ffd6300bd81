/* The kernel inside images/prebuilt/demo_quant-*.whl: a vendor's prebuilt library, taken as it is.
 * Rebuild the wheel with images/prebuilt/make-wheel.sh (needs the builder image). */
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif

const char *unibake_kernel_info(void) { return "demo_quant@" UNIBAKE_KERNEL_VERSION; }

double demo_quant_scale(double absmax) { return absmax > 0 ? 127.0 / absmax : 1.0; }
