// Built only with MESHFUSE_OPENMP=OFF (the ThreadSanitizer build): the OpenMP runtime calls the
// CPU kernels make, answered for one thread. The pragmas themselves are ignored by the compiler,
// so every parallel loop runs on the calling thread and these answers are the truth.
extern "C" {
int omp_get_max_threads() { return 1; }
int omp_get_thread_num() { return 0; }
int omp_get_num_threads() { return 1; }
}
