/* Stand-in for NVSHMEM's host library, which the vendor ships prebuilt (images/prebuilt/*.tar.gz).
 * Rebuild the tarball with images/prebuilt/make-tarball.sh. */
const char *unibake_kernel_info(void) { return "nvshmem@3.2.5+cuda12"; }
int nvshmem_my_pe(void) { return 0; }
