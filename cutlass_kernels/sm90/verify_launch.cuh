// The launches of the sm_90a verify kernels, declared for the host side (tree_attention_sm90.cu)
// and defined in verify_attention.cuh and verify_attention_transposed.cuh. Each (dtype, cache,
// schedule) is instantiated in a translation unit of its own (verify_attention_<dtype>[_fp8]_<schedule>.cu,
// verify_attention_<dtype>_fp8_transposed.cu), so that ninja compiles the ten in parallel.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>  // the Element types the host side names

#include "verify_params.cuh"

namespace ddtree::sm90 {

// kPersistent: the persistent schedule (grid = CTAs), else the split schedule. kFp8Kv: the cache
// holds e4m3 values (dequantized in shared memory, gather_fp8.cuh), else values of Element.
template <class Element, bool kPersistent, bool kFp8Kv>
void launch_verify_attention(const VerifyParams& params, dim3 grid, cudaStream_t stream);

// The transposed e4m3 kernel of the split schedule (verify_attention_transposed.cuh), q and out
// of dtype Element.
template <class Element>
void launch_verify_attention_transposed(const VerifyParams& params, dim3 grid, cudaStream_t stream);

}  // namespace ddtree::sm90

// The explicit instantiation in one of those translation units.
#define DDTREE_INSTANTIATE_VERIFY_ATTENTION(ELEMENT, PERSISTENT, FP8_KV)                                              \
  template void ddtree::sm90::launch_verify_attention<ELEMENT, PERSISTENT, FP8_KV>(const ddtree::sm90::VerifyParams&, dim3, \
                                                                                   cudaStream_t);
#define DDTREE_INSTANTIATE_VERIFY_ATTENTION_TRANSPOSED(ELEMENT) \
  template void ddtree::sm90::launch_verify_attention_transposed<ELEMENT>(const ddtree::sm90::VerifyParams&, dim3, cudaStream_t);
