/* Stand-in for DeepEP's inter-node dispatch (RDMA); only the multi-node layout loads it. */
#ifndef UNIBAKE_KERNEL_NAME
#define UNIBAKE_KERNEL_NAME "deep_ep"
#endif
#ifndef UNIBAKE_KERNEL_VERSION
#define UNIBAKE_KERNEL_VERSION "dev"
#endif
const char *unibake_kernel_info(void) { return UNIBAKE_KERNEL_NAME "@" UNIBAKE_KERNEL_VERSION; }
int deep_ep_num_rdma_ranks(int nodes) { return nodes; }
