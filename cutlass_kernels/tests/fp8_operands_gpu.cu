// The FP8 GEMM operands of sm90/fp8_operands.cuh run on an sm_90 GPU, each against its definition
// computed on the host (not against the host check's emulation of ldmatrix / stmatrix, so that a
// wrong reading of those instructions shows here):
//   nvcc -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -I<cutlass include> -I cutlass_kernels \
//        cutlass_kernels/tests/fp8_operands_gpu.cu -o /tmp/fp8_operands_gpu && /tmp/fp8_operands_gpu
// 1. transpose_v_warp (four warps, one tile): V^T[n][slot] = V[slot_key(slot)][n].
// 2. p_as_e4m3_operands: register r's bytes are e4m3(P) and e4m3(P - hi) of values p_register_of(r, 0..3).
// 3. quantize_q_tile: hi and lo of q x 2^k (k the largest with max |q| 2^k <= 448) at their
//    sw64_byte_offset, and 2^-k returned.
// 4. copy_kv_sw64 (both release groups): the rows of the slots (a negative slot: zeros) at their
//    sw64_byte_offset, the chunk barriers completing.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cute/tensor.hpp>

#include "sm90/fp8_operands.cuh"

using namespace ddtree::sm90;
using Fp8 = cutlass::float_e4m3_t;

#define CHECK_CUDA(call)                                                                  \
  do {                                                                                    \
    const cudaError_t err = (call);                                                       \
    if (err != cudaSuccess) {                                                             \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(err), __FILE__, __LINE__); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

constexpr int kTileBytes = 64 * 576, kVtBytes = 512 * 64;

// Dynamic shared memory (more than the 48 KB a kernel may declare); the operands' swizzles are
// offsets from a tile's base, which needs only 16-byte alignment here (no wgmma descriptor).
extern __shared__ uint4 dynamic_smem[];

__global__ void transpose_kernel(const uint8_t* tile_image, uint8_t* vt_out) {
  uint8_t* const tile = reinterpret_cast<uint8_t*>(dynamic_smem);
  uint8_t* const vt = tile + kTileBytes;
  for (int i = threadIdx.x; i < kTileBytes; i += blockDim.x) tile[i] = tile_image[i];
  __syncthreads();
  transpose_v_warp(static_cast<uint32_t>(__cvta_generic_to_shared(tile)), static_cast<uint32_t>(__cvta_generic_to_shared(vt)),
                   threadIdx.x / 32, threadIdx.x % 32);
  __syncthreads();
  for (int i = threadIdx.x; i < kVtBytes; i += blockDim.x) vt_out[i] = vt[i];
}

__global__ void pack_p_kernel(const float* p_in, uint32_t* hi_out, uint32_t* lo_out) {
  auto p = cute::make_tensor<float>(cute::Shape<cute::_32>{});
  for (int i = 0; i < 32; ++i) p(i) = p_in[32 * threadIdx.x + i];
  uint32_t hi[8], lo[8];
  p_as_e4m3_operands(p, hi, lo);
  for (int r = 0; r < 8; ++r) {
    hi_out[8 * threadIdx.x + r] = hi[r];
    lo_out[8 * threadIdx.x + r] = lo[r];
  }
}

__global__ void quantize_kernel(const cutlass::bfloat16_t* q, int valid_rows, uint8_t* hi_out, uint8_t* lo_out, float* inv_scale) {
  uint8_t* const hi = reinterpret_cast<uint8_t*>(dynamic_smem);
  uint8_t* const lo = hi + kTileBytes;
  __shared__ float warp_max[8];
  const int row = threadIdx.x / 4;
  const float inv = quantize_q_tile<cutlass::bfloat16_t>(static_cast<uint32_t>(__cvta_generic_to_shared(hi)),
                                                         static_cast<uint32_t>(__cvta_generic_to_shared(lo)), q + row * 576,
                                                         row < valid_rows, threadIdx.x, warp_max, 1);
  __syncthreads();
  for (int i = threadIdx.x; i < kTileBytes; i += blockDim.x) {
    hi_out[i] = hi[i];
    lo_out[i] = lo[i];
  }
  if (threadIdx.x == 0) *inv_scale = inv;
}

__global__ void copy_kernel(const uint8_t* pool, const int* slots, uint8_t* tile_out) {
  uint8_t* const tile = reinterpret_cast<uint8_t*>(dynamic_smem);
  __shared__ uint64_t chunk_full[9];
  if (threadIdx.x < 9) cutlass::arch::ClusterBarrier::init(&chunk_full[threadIdx.x], 128);
  cutlass::arch::fence_barrier_init();
  __syncthreads();
  const int row0 = 16 * (threadIdx.x / 32) + (threadIdx.x % 32) / 8;  // this thread's rows 4 i apart (kv_piece)
  int slot[4];
  for (int i = 0; i < 4; ++i) slot[i] = slots[row0 + 4 * i];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
  copy_kv_sw64<0, 4>(threadIdx.x, base, pool, 576, slot, chunk_full);
  copy_kv_sw64<4, 9>(threadIdx.x, base, pool, 576, slot, chunk_full);
  for (int c = 0; c < 9; ++c) cutlass::arch::ClusterBarrier::wait(&chunk_full[c], 0);
  __syncthreads();
  for (int i = threadIdx.x; i < kTileBytes; i += blockDim.x) tile_out[i] = tile[i];
}

static uint8_t e4m3_bits(float v) { return Fp8(v).storage; }
static float e4m3_value(uint8_t bits) { return float(Fp8::bitcast(bits)); }

int main() {
  int failures = 0;
  std::mt19937 rng(7);
  uint8_t *d_a, *d_b, *d_c;
  CHECK_CUDA(cudaMalloc(&d_a, 1 << 20));
  CHECK_CUDA(cudaMalloc(&d_b, 1 << 20));
  CHECK_CUDA(cudaMalloc(&d_c, 1 << 20));
  CHECK_CUDA(cudaFuncSetAttribute(transpose_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTileBytes + kVtBytes));
  CHECK_CUDA(cudaFuncSetAttribute(quantize_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kTileBytes));

  {  // 1. The transpose.
    std::vector<uint8_t> tile(kTileBytes), vt(kVtBytes);
    for (auto& b : tile) b = uint8_t(rng());
    CHECK_CUDA(cudaMemcpy(d_a, tile.data(), kTileBytes, cudaMemcpyHostToDevice));
    transpose_kernel<<<1, 128, kTileBytes + kVtBytes>>>(d_a, d_b);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(vt.data(), d_b, kVtBytes, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int n = 0; n < 512; ++n) {
      for (int slot = 0; slot < 64; ++slot) {
        const int key = 32 * (slot / 32) + slot_key(slot % 32);
        if (vt[sw64_byte_offset<512>(n, slot)] != tile[sw64_byte_offset<64>(key, n)]) bad++;
      }
    }
    std::printf("transpose_v_warp: %d of %d bytes wrong\n", bad, kVtBytes);
    failures += bad;
  }
  {  // 2. P's registers, values in [0, 256] as the kernel's P, zeros and tiny values among them.
    std::vector<float> p(128 * 32);
    std::uniform_real_distribution<float> unit(0.f, 1.f);
    for (size_t i = 0; i < p.size(); ++i) p[i] = i % 17 == 0 ? 0.f : std::ldexp(unit(rng), -int(rng() % 20)) * 256.f;
    std::vector<uint32_t> hi(128 * 8), lo(128 * 8);
    CHECK_CUDA(cudaMemcpy(d_a, p.data(), p.size() * 4, cudaMemcpyHostToDevice));
    pack_p_kernel<<<1, 128>>>(reinterpret_cast<float*>(d_a), reinterpret_cast<uint32_t*>(d_b), reinterpret_cast<uint32_t*>(d_c));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(hi.data(), d_b, hi.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(lo.data(), d_c, lo.size() * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int t = 0; t < 128; ++t) {
      for (int r = 0; r < 8; ++r) {
        for (int v = 0; v < 4; ++v) {
          const float x = p[32 * t + p_register_of(r, v)];
          const uint8_t h = e4m3_bits(x), l = e4m3_bits(x - e4m3_value(h));
          if (uint8_t(hi[8 * t + r] >> (8 * v)) != h || uint8_t(lo[8 * t + r] >> (8 * v)) != l) bad++;
        }
      }
    }
    std::printf("p_as_e4m3_operands: %d of %d values wrong\n", bad, 128 * 32);
    failures += bad;
  }
  {  // 3. q's parts: 60 valid rows of a 64-row block, magnitudes spread over rows.
    std::vector<cutlass::bfloat16_t> q(64 * 576);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int r = 0; r < 64; ++r) {
      for (int c = 0; c < 576; ++c) q[r * 576 + c] = cutlass::bfloat16_t(normal(rng) * std::ldexp(1.f, r % 7 - 3));
    }
    const int valid_rows = 60;
    CHECK_CUDA(cudaMemcpy(d_a, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
    quantize_kernel<<<1, 256, 2 * kTileBytes>>>(reinterpret_cast<cutlass::bfloat16_t*>(d_a), valid_rows, d_b, d_c,
                                reinterpret_cast<float*>(d_a + (1 << 19)));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<uint8_t> hi(kTileBytes), lo(kTileBytes);
    float inv = 0.f;
    CHECK_CUDA(cudaMemcpy(hi.data(), d_b, kTileBytes, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(lo.data(), d_c, kTileBytes, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&inv, d_a + (1 << 19), 4, cudaMemcpyDeviceToHost));
    float amax = 0.f;
    for (int r = 0; r < valid_rows; ++r) {
      for (int c = 0; c < 576; ++c) amax = std::fmax(amax, std::fabs(float(q[r * 576 + c])));
    }
    int exponent = 0;
    const float mantissa = std::frexp(amax, &exponent);
    const int k = (mantissa <= 0.875f ? 9 : 8) - exponent;
    int bad = inv == std::ldexp(1.f, -k) ? 0 : 1;
    if (bad) std::printf("quantize_q_tile returned %g, not 2^%d\n", inv, -k);
    int inexact = 0;
    for (int r = 0; r < 64; ++r) {
      for (int c = 0; c < 576; ++c) {
        const float x = r < valid_rows ? std::ldexp(float(q[r * 576 + c]), k) : 0.f;
        const uint8_t h = e4m3_bits(x), l = e4m3_bits(x - e4m3_value(h));
        const uint32_t at = sw64_byte_offset<64>(r, c);
        if (hi[at] != h || lo[at] != l) bad++;
        if (std::fabs(x) >= 0.25f && e4m3_value(h) + e4m3_value(l) != x) inexact++;  // hi + lo hold q exactly above 2^-2
      }
    }
    std::printf("quantize_q_tile: %d of %d values wrong; %d above 2^-2 not held exactly by hi + lo\n", bad, 64 * 576, inexact);
    failures += bad + inexact;
  }
  {  // 4. The gather's copy, one slot in five negative.
    const int pool_rows = 300;
    std::vector<uint8_t> pool(pool_rows * 576), tile(kTileBytes);
    for (auto& b : pool) b = uint8_t(rng());
    std::vector<int> slots(64);
    for (int r = 0; r < 64; ++r) slots[r] = r % 5 == 4 ? -1 : int(rng() % pool_rows);
    CHECK_CUDA(cudaMemcpy(d_a, pool.data(), pool.size(), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_c, slots.data(), 64 * 4, cudaMemcpyHostToDevice));
    copy_kernel<<<1, 128, kTileBytes>>>(d_a, reinterpret_cast<int*>(d_c), d_b);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(tile.data(), d_b, kTileBytes, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int r = 0; r < 64; ++r) {
      for (int c = 0; c < 576; ++c) {
        const uint8_t expected = slots[r] < 0 ? 0 : pool[slots[r] * 576 + c];
        if (tile[sw64_byte_offset<64>(r, c)] != expected) bad++;
      }
    }
    std::printf("copy_kv_sw64: %d of %d bytes wrong\n", bad, kTileBytes);
    failures += bad;
  }
  std::printf("%s (%d failures)\n", failures ? "FAILED" : "all FP8 operands right on the GPU", failures);
  return failures ? 1 : 0;
}
