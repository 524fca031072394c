// The asynchronous copies the kernel's loads are made of: 16-byte cp.async, TMA boxes and the
// mbarrier transaction counts they complete on.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cstdint>

namespace ddtree::sm90 {

// 16 bytes global -> shared, bypassing L1; the L2 fetches 256 bytes of the 1152-byte row at once.
__device__ __forceinline__ void cp_async_16(uint32_t smem_dst, const void* gmem_src, bool valid) {
  const int src_size = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(gmem_src), "r"(src_size));
}

// A 64-row x 64-column box of the pool (the tensor map's box, 128-byte swizzle: the cp.async
// layout) into shared memory, its bytes counted on `mbar`.
__device__ __forceinline__ void tma_load_box(const CUtensorMap* map, uint32_t smem_dst, uint64_t* mbar, int col, int row) {
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(mbar));
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                   smem_dst),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar)
               : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) global -> shared by the TMA unit,
// counted on `mbar`: one instruction a KV row, however scattered the rows are.
__device__ __forceinline__ void bulk_copy(uint32_t smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* mbar) {
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(mbar));
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_dst),
               "l"(gmem_src), "r"(bytes), "r"(bar)
               : "memory");
}

// This thread's arrival on `mbar`, announcing `bytes` of copies that complete on it.
__device__ __forceinline__ void arrive_expecting(uint64_t* mbar, uint32_t bytes) {
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(mbar));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Announces `bytes` of TMA data, then `count` arrivals at once (the 128 gather threads' share).
__device__ __forceinline__ void expect_bytes(uint64_t* mbar, uint32_t bytes) {
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(mbar));
  asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void arrive_many(uint64_t* mbar, uint32_t count) {
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(mbar));
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

}  // namespace ddtree::sm90
