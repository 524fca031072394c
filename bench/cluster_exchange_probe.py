"""What it costs two CTAs of a cluster to swap 64 x 64 fp32 partial logits each tile: the unknown
of the column-split redesign (docs/kernel-log.md, "Next (end of the seventeenth session)": CTA 0
computes S over q's and the keys' columns 0-255, CTA 1 over 256-575, and each needs the other's
partial S before its softmax):

  python3 -m bench.cluster_exchange_probe      (on the GPU machine; builds one small program with nvcc)

132 CTAs in clusters of two, one warpgroup each (a thread holds 32 floats of the tile, as a
wgmma accumulator of 64 x 64 does). Each tile, every thread sends its 32 floats to the peer CTA
and adds the peer's 32 to its own, in one of two ways:
- `stores`: 8 remote 16-byte stores a thread (st.shared::cluster) into the peer's receive buffer,
  then a remote arrive (release, cluster scope) on the peer's mbarrier, 128 arrivals a tile;
- `bulk`: the tile into the CTA's own shared memory, then one thread's bulk copy
  (cp.async.bulk shared::cluster) of the 16 KB into the peer's buffer, counted on the peer's
  mbarrier as transaction bytes.
The receiver waits for its buffer, reads and adds, and releases the buffer to the sender with one
remote arrive. Buffers per direction: 1 or 2 (`depth`). Between its send and its wait a CTA spins
`work` cycles (the GEMM or softmax of the other warpgroup that would hide the exchange). Printed:
cycles a tile per CTA, and the exchange's cost over the work (cycles a tile - work). Every
received value is checked against what the peer sent.
"""

from __future__ import annotations

import sys

from bench.cuda_probe import build_and_run

SOURCE = r"""
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

constexpr int kThreads = 128, kFloats = 32, kTileBytes = kThreads * kFloats * 4;  // 64 x 64 fp32

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ inline uint32_t peer_addr(uint32_t local, uint32_t peer) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(peer));
  return remote;
}
__device__ inline void wait_phase(uint32_t bar, int phase) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n"
               ::"r"(bar), "r"(phase) : "memory");
}
__device__ inline void arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote_bar) : "memory");
}
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ inline void spin(int cycles) {
  const long long until = clock64() + cycles;
  while (clock64() < until) {}
}

// mode 0: remote stores; mode 1: bulk copy. depth: buffers per direction (1 or 2).
__global__ void __cluster_dims__(2, 1, 1) exchange_kernel(int tiles, int mode, int depth, int work, long long* cycles,
                                                           int* wrong) {
  extern __shared__ __align__(128) float buffers[];  // send[2], then recv[2]: 64 KB
  float (*send)[kThreads * kFloats] = reinterpret_cast<float (*)[kThreads * kFloats]>(buffers);
  float (*recv)[kThreads * kFloats] = send + 2;
  __shared__ __align__(8) uint64_t full[2], free_bar[2];
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const uint32_t peer = rank ^ 1u;
  const int t = threadIdx.x;
  if (t == 0) {
    for (int s = 0; s < 2; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&full[s])), "r"(mode == 0 ? kThreads : 1));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&free_bar[s])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();
  float acc[kFloats];
  for (int i = 0; i < kFloats; ++i) acc[i] = 0.f;
  int bad = 0;
  const long long start = clock64();
  for (int tile = 0; tile < tiles; ++tile) {
    const int s = tile % depth, use = tile / depth;  // buffer s is used for the use-th time
    float mine[kFloats];
    for (int i = 0; i < kFloats; ++i) mine[i] = float(rank * 1000003u + tile * 4099u + t * kFloats + i);
    if (mode == 1 && t == 0) {  // this use of my receive buffer expects one tile's bytes
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&full[s])), "r"(kTileBytes) : "memory");
    }
    if (use > 0) wait_phase(smem_addr(&free_bar[s]), (use - 1) & 1);  // the peer has read my previous tile in s
    if (mode == 0) {
      const uint32_t dst = peer_addr(smem_addr(&recv[s][t * kFloats]), peer);
      for (int i = 0; i < kFloats; i += 4) {
        asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(dst + i * 4), "f"(mine[i]), "f"(mine[i + 1]),
                     "f"(mine[i + 2]), "f"(mine[i + 3]) : "memory");
      }
      arrive_remote(peer_addr(smem_addr(&full[s]), peer));
    } else {
      for (int i = 0; i < kFloats; i += 4) *reinterpret_cast<float4*>(&send[s][t * kFloats + i]) = make_float4(mine[i], mine[i + 1], mine[i + 2], mine[i + 3]);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("bar.sync 1, %0;" ::"r"(kThreads) : "memory");
      if (t == 0) {
        asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(peer_addr(smem_addr(&recv[s][0]), peer)), "r"(smem_addr(&send[s][0])), "r"(kTileBytes),
                     "r"(peer_addr(smem_addr(&full[s]), peer)) : "memory");
      }
    }
    if (work > 0) spin(work);
    wait_phase(smem_addr(&full[s]), use & 1);  // the peer's tile is in my buffer s
    for (int i = 0; i < kFloats; i += 4) {
      const float4 v = *reinterpret_cast<const float4*>(&recv[s][t * kFloats + i]);
      const uint32_t want = peer * 1000003u + tile * 4099u + t * kFloats + i;
      bad += (v.x != float(want)) + (v.y != float(want + 1)) + (v.z != float(want + 2)) + (v.w != float(want + 3));
      acc[i] += v.x; acc[i + 1] += v.y; acc[i + 2] += v.z; acc[i + 3] += v.w;
    }
    asm volatile("bar.sync 1, %0;" ::"r"(kThreads) : "memory");  // every thread has read buffer s
    if (t == 0) arrive_remote(peer_addr(smem_addr(&free_bar[s]), peer));
  }
  const long long stop = clock64();
  cluster_sync();  // neither CTA leaves while the other may still write into it
  float sum = 0.f;
  for (int i = 0; i < kFloats; ++i) sum += acc[i];
  if (sum == 1234.5f) bad += 1000000;  // keeps the adds
  if (bad) atomicAdd(wrong, bad);
  if (t == 0) cycles[blockIdx.x] = stop - start;
}

int main() {
  const int ctas = 132, tiles = 2000;
  long long* cycles; int* wrong;
  CHECK(cudaMalloc(&cycles, ctas * sizeof(long long)));
  CHECK(cudaMalloc(&wrong, sizeof(int)));
  std::vector<long long> host(ctas);
  const char* names[2] = {"stores", "bulk"};
  const int smem = 4 * kTileBytes;
  CHECK(cudaFuncSetAttribute(exchange_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  printf("%-7s %5s %5s %10s %10s %6s\n", "mode", "depth", "work", "cyc/tile", "over work", "wrong");
  for (int mode = 0; mode < 2; ++mode) {
    for (int depth = 1; depth <= 2; ++depth) {
      for (int work : {0, 500, 1000, 2000}) {
        CHECK(cudaMemset(wrong, 0, sizeof(int)));
        for (int rep = 0; rep < 2; ++rep) {  // the first a warm-up
          exchange_kernel<<<ctas, kThreads, smem>>>(tiles, mode, depth, work, cycles, wrong);
          CHECK(cudaGetLastError());
          CHECK(cudaDeviceSynchronize());
        }
        int host_wrong = 0;
        CHECK(cudaMemcpy(host.data(), cycles, ctas * sizeof(long long), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(&host_wrong, wrong, sizeof(int), cudaMemcpyDeviceToHost));
        double sum = 0;
        for (long long c : host) sum += double(c);
        const double per_tile = sum / ctas / tiles;
        printf("%-7s %5d %5d %10.0f %10.0f %6d\n", names[mode], depth, work, per_tile, per_tile - work, host_wrong);
      }
    }
  }
  return 0;
}
"""


def main() -> int:
    return build_and_run(SOURCE, "cluster_exchange_probe")


if __name__ == "__main__":
    sys.exit(main())
