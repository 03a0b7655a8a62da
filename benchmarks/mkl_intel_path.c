/* MKL chooses its float32 matrix kernels by CPU vendor: on an AMD CPU its AVX2 ones, whatever
 * MKL_CBWR asks, on an Intel CPU with AVX-512 its AVX-512 ones. Their rounding differs in the last
 * bit, and a policy's simulated episodes grow that into other datasets. Preloaded into a process
 * whose torch links MKL (torch's x86 wheels do), this answers MKL's "is this an Intel CPU?" with
 * yes, so an AMD CPU with AVX-512 runs the kernels an Intel one does. benchmarks/offline_datasets.sh
 * builds and preloads it on such CPUs, which then record the datasets' committed digests
 * (benchmarks/README.md, Offline against d3rlpy). */
int mkl_serv_intel_cpu_true(void) { return 1; }
