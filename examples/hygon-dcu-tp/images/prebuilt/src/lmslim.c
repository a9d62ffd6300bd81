/* The library inside images/prebuilt/lmslim-*.whl: the vendor's prebuilt quantisation kernels (a stand-in).
 * Rebuild the wheel with images/prebuilt/make-wheel.sh. */
const char *unibake_kernel_info(void) { return "lmslim@0.2.1+das.dtk2504"; }
