// Conversions the kernel's parts share: base-2 exponentials and pairs of 16-bit values.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>

namespace ddtree::sm90 {

// 2^x in one MUFU.EX2, results below 2^-126 flushed to 0 (exp2f keeps them, at the cost of a
// compare and two predicated multiplies a call). In the softmax a row's sum is >= 1 (its
// reference maximum is one of its logits), so what is flushed is below the sum's precision.
// exp2_approx(-inf) = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two floats rounded to a 16-bit type (bf16 or fp16) in one conversion, `lo` in the low half (the
// lower address).
template <class Element>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  if constexpr (cute::is_same_v<Element, cutlass::bfloat16_t>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    static_assert(cute::is_same_v<Element, cutlass::half_t>, "bf16 or fp16");
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// The two floats of a pair packed by pack_pair.
template <class Element>
__device__ __forceinline__ float2 unpack_pair(uint32_t word) {
  if constexpr (cute::is_same_v<Element, cutlass::bfloat16_t>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
  } else {
    static_assert(cute::is_same_v<Element, cutlass::half_t>, "bf16 or fp16");
    return __half22float2(*reinterpret_cast<const __half2*>(&word));
  }
}

}  // namespace ddtree::sm90
