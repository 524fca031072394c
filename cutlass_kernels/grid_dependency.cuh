// Programmatic dependent launch (sm_90+): a kernel of the verify step may be launched while the
// kernel before it on the stream still runs, so its launch latency and set-up overlap that
// kernel's tail. The earlier kernel allows it (allow_dependent_grids, a hint); the later one
// calls wait_for_prior_grids before it touches global memory, which returns once every kernel
// before it on the stream has finished and its writes are visible. Both are no-ops where the
// launch did not ask for the overlap, and below sm_90.
//
// The verify step chains its launches so: preparation -> attention -> combine. Each later kernel
// waits before its first global access, whatever kernel comes before it (another op may sit
// between two of ours under torch.compile), so the chain needs nothing of its neighbours.
#pragma once
#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

namespace ddtree {

__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// DDTREE_PDL=0 launches the chain's kernels plainly (one after another), for A/B timing. Read at
// every launch (a few hundred ns of host time; none in a replayed graph), so that one process can
// capture both forms.
inline bool dependent_launch_enabled() {
  const char* v = std::getenv("DDTREE_PDL");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to start before the kernel ahead of it
// on the stream has finished (the kernel must call wait_for_prior_grids first).
template <class... KernelArgs, class... Args>
cudaError_t launch_dependent(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent_launch_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace ddtree
