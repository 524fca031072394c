"""Whether one-row TMA boxes can gather scattered KV rows into the sm90 kernel's tile layout, and
at what rate (the question behind a producer with few registers: today's gather warpgroup needs
56 registers for its 16-byte cp.async addresses, which caps the GEMM warpgroups at 224, and
queueing the next S behind the last P V GEMM spills at 224):

  python3 -m bench.tma_row_probe      (on the GPU machine; builds one small program with nvcc)

The program gathers 64 random rows of a [rows, 576] bf16 pool into a 64 x 576 tile of 64-column
chunks with the 128-byte swizzle (traits.cuh's layout), one 1 x 64 box per row and chunk (576 boxes
a tile), each box written at its row's address inside the chunk. It checks the bytes against the
layout (`p_tile_byte_offset`): if the TMA unit swizzles by the shared-memory address, every byte
is in place. Then each of 132 CTAs gathers tiles of random rows of an L2-sized pool into two
alternating stages, issuing the boxes from 1 or 4 threads, against 128 threads' 16-byte cp.async
(the gather warpgroup's way), and prints cycles per tile.
"""

from __future__ import annotations

import sys

from bench.cuda_probe import build_and_run

SOURCE = r"""
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

constexpr int kRows = 64, kCols = 576, kChunks = 9, kChunkBytes = 64 * 64 * 2, kTileBytes = kChunks * kChunkBytes;

__host__ __device__ inline uint32_t swizzled(int row, int col) {  // byte of (row, col) in a 64 x 64 chunk
  return uint32_t((row / 8) * 1024 + (row % 8) * 128 + (((col / 8) ^ (row % 8)) * 16) + (col % 8) * 2);
}

__device__ inline void wait_phase(uint32_t bar, int phase) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n" ::"r"(bar), "r"(phase) : "memory");
}

// Rows slots[0..63] of the pool into the tile at `tile` (shared), issued by `issuers` threads
// (thread t takes rows t, t + issuers, ...), all bytes counted on `bar`.
__device__ inline void tma_rows(const CUtensorMap* map, uint32_t tile, uint32_t bar, const int* slots, int issuers) {
  const int t = threadIdx.x;
  if (t == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kTileBytes) : "memory");
  if (t >= issuers) return;
  for (int r = t; r < kRows; r += issuers) {
    const int slot = slots[r];
    for (int c = 0; c < kChunks; ++c) {
      const uint32_t dst = tile + c * kChunkBytes + (r / 8) * 1024 + (r % 8) * 128;
      asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                   ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c * 64), "r"(slot), "r"(bar) : "memory");
    }
  }
}

// The same rows by 128 threads' 16-byte cp.async (8 lanes a row), one arrival each on `bar`.
__device__ inline void cp_async_rows(const uint16_t* pool, uint32_t tile, uint32_t bar, const int* slots) {
  const int t = threadIdx.x;
  if (t >= 128) return;
  const int piece = t % 8;
  for (int r = t / 8; r < kRows; r += 16) {
    const uint16_t* row = pool + int64_t(slots[r]) * kCols;
    for (int c = 0; c < kChunks; ++c) {
      const uint32_t dst = tile + c * kChunkBytes + swizzled(r, piece * 8);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(row + c * 64 + piece * 8) : "memory");
    }
  }
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// The dynamic shared memory's first 1024-byte boundary (the launch asks for 1 KB more).
__device__ inline uint32_t aligned_base(uint8_t* raw, uint8_t** generic) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  const uint32_t pad = (1024u - (addr & 1023u)) & 1023u;
  if (generic) *generic = raw + pad;
  return addr + pad;
}

__global__ void layout_kernel(const __grid_constant__ CUtensorMap map, const int* slots, uint8_t* out) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t mbar;
  uint8_t* smem;
  const uint32_t tile = aligned_base(smem_raw, &smem);
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&mbar));
  if (threadIdx.x == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar));
  __syncthreads();
  tma_rows(&map, tile, bar, slots, 1);
  wait_phase(bar, 0);
  for (int i = threadIdx.x; i < kTileBytes; i += blockDim.x) out[i] = smem[i];
}

// mode 0: TMA from 1 thread, 1: TMA from 4 threads, 2: 128 threads' cp.async. Tiles t = 0..n-1
// (random rows slots[64 (blockIdx n + t) ...]) into stages t % 2; a stage is reused once the tile
// before it in that stage has landed.
__global__ void rate_kernel(const __grid_constant__ CUtensorMap map, const uint16_t* pool, const int* slots, int n, int mode,
                            long long* cycles) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t mbar[2];
  const uint32_t base = aligned_base(smem_raw, nullptr);
  uint32_t bar[2];
  for (int s = 0; s < 2; ++s) bar[s] = static_cast<uint32_t>(__cvta_generic_to_shared(&mbar[s]));
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar[s]), "r"(mode == 2 ? 128 : 1));
  }
  __syncthreads();
  const long long start = clock64();
  for (int t = 0; t < n; ++t) {
    const int s = t % 2;
    if (t >= 2) wait_phase(bar[s], ((t - 2) / 2) & 1);  // the stage's previous tile landed
    __syncthreads();
    const int* rows = slots + int64_t(blockIdx.x * n + t) * kRows;
    if (mode == 2) cp_async_rows(pool, base + s * kTileBytes, bar[s], rows);
    else tma_rows(&map, base + s * kTileBytes, bar[s], rows, mode == 0 ? 1 : 4);
  }
  for (int t = (n >= 2 ? n - 2 : 0); t < n; ++t) wait_phase(bar[t % 2], (t / 2) & 1);
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - start;
}

int main() {
  const int pool_rows = 16384, ctas = 132, tiles = 200;  // 18 MB pool: L2 hits, as in the kernel
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000, cudaEnableDefault, &found));
  std::vector<uint16_t> host_pool(size_t(pool_rows) * kCols);
  for (size_t i = 0; i < host_pool.size(); ++i) host_pool[i] = uint16_t((i * 2654435761u) >> 7);
  std::vector<int> host_slots(size_t(ctas) * tiles * kRows);
  srand(1);
  for (auto& s : host_slots) s = rand() % pool_rows;
  uint16_t* pool; int* slots; uint8_t* out; long long* cycles;
  CHECK(cudaMalloc(&pool, host_pool.size() * 2));
  CHECK(cudaMalloc(&slots, host_slots.size() * 4));
  CHECK(cudaMalloc(&out, kTileBytes));
  CHECK(cudaMalloc(&cycles, ctas * sizeof(long long)));
  CHECK(cudaMemcpy(pool, host_pool.data(), host_pool.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(slots, host_slots.data(), host_slots.size() * 4, cudaMemcpyHostToDevice));
  CUtensorMap map;
  const cuuint64_t dims[2] = {kCols, cuuint64_t(pool_rows)};
  const cuuint64_t strides[1] = {kCols * 2};
  const cuuint32_t box[2] = {64, 1}, element_strides[2] = {1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, pool, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    printf("cuTensorMapEncodeTiled refused a 1 x 64 box with the 128-byte swizzle\n");
    return 1;
  }
  CHECK(cudaFuncSetAttribute(layout_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTileBytes + 1024));
  layout_kernel<<<1, 128, kTileBytes + 1024>>>(map, slots, out);
  CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> tile(kTileBytes);
  CHECK(cudaMemcpy(tile.data(), out, kTileBytes, cudaMemcpyDeviceToHost));
  long wrong = 0, unswizzled = 0;
  for (int r = 0; r < kRows; ++r) {
    for (int col = 0; col < kCols; ++col) {
      const uint16_t want = host_pool[size_t(host_slots[r]) * kCols + col];
      const int c = col / 64, j = col % 64;
      uint16_t got, plain;
      memcpy(&got, &tile[c * kChunkBytes + swizzled(r, j)], 2);
      memcpy(&plain, &tile[c * kChunkBytes + (r / 8) * 1024 + (r % 8) * 128 + j * 2], 2);
      wrong += got != want;
      unswizzled += plain == want;
    }
  }
  printf("layout: %ld of %d elements out of place (%s); %ld where an unswizzled row would put them\n", wrong, kRows * kCols,
         wrong == 0 ? "TMA swizzles by the shared-memory address: one-row boxes build the kernel's tile" : "not the kernel's layout",
         unswizzled);
  const char* names[3] = {"TMA, 1 issuing thread", "TMA, 4 issuing threads", "cp.async, 128 threads"};
  CHECK(cudaFuncSetAttribute(rate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kTileBytes + 1024));
  std::vector<long long> host_cycles(ctas);
  for (int mode = 0; mode < 3; ++mode) {
    for (int rep = 0; rep < 2; ++rep) {  // the first a warm-up
      rate_kernel<<<ctas, 128, 2 * kTileBytes + 1024>>>(map, pool, slots, tiles, mode, cycles);
      CHECK(cudaDeviceSynchronize());
    }
    CHECK(cudaMemcpy(host_cycles.data(), cycles, ctas * sizeof(long long), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (long long c : host_cycles) sum += double(c);
    printf("rate: %s: %.0f cycles a 72 KB tile per SM, all %d SMs at once\n", names[mode], sum / ctas / tiles, ctas);
  }
  return 0;
}
"""


def main() -> int:
    return build_and_run(SOURCE, "tma_row_probe")


if __name__ == "__main__":
    sys.exit(main())
