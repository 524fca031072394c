"""What it costs two CTAs of a cluster to swap 64 x 64 fp32 partial logits each tile: the unknown
of the column-split redesign (docs/kernel-log.md, "Next (end of the seventeenth session)": CTA 0
computes S over q's and the keys' columns 0-255, CTA 1 over 256-575, and each needs the other's
partial S before its softmax), and whether that cost is latency a deeper pipeline hides or a
per-tile cost at the sender or receiver that nothing hides:

  python3 -m bench.cluster_exchange_probe      (on the GPU machine; builds one small program with nvcc)

132 CTAs in clusters of two, one warpgroup each (a thread holds 32 floats of the tile, as a
wgmma accumulator of 64 x 64 does), one CTA an SM (every run reserves the same 224 KB of shared
memory). Each tile, every thread sends its 32 floats to the peer CTA, by one of two transports:
- `stores`: 8 remote 16-byte stores a thread (st.shared::cluster) into the peer's receive buffer,
  then a remote arrive (release, cluster scope) on the peer's mbarrier, 128 arrivals a tile;
- `bulk`: the tile into the CTA's own staging buffer, then one thread's bulk copy
  (cp.async.bulk shared::cluster) of the 16 KB into the peer's buffer, counted on the peer's
  mbarrier as transaction bytes.
Modes:
- `none`: the spin only (`work` cycles a tile), the baseline of the loop and the clock;
- `send`: every tile sent, nothing waited or read, one cluster sync at the end (bulk's receiver
  only books the expected bytes on its mbarriers and, after the timed loop, waits for them to land):
  the sender's cost a tile, with no round trip;
- `exchange`: the receiver waits for the peer's tile, reads it, checks every value against what
  the peer sent, adds it to its own, and frees the buffer with one remote arrive (no wait). It
  consumes tile t after sending tile t + `lag` (lag 0: each tile's exchange is waited before the
  next is sent; lag 1, 2: consecutive tiles' exchanges overlap). `depth` receive buffers a
  direction (1, 2, 4, 8; depth >= lag + 1): the sender waits for a buffer to be free only when it
  reuses it, depth tiles later, so beyond depth 1 no free round trip is on the critical path.
  Bulk's staging ring holds at most 6 tiles (8 receive + 6 staging tiles fill the shared memory),
  and its source is known read only once the peer frees the tile, so at depth 8 its sender waits
  for the tile 6 back.
Between its send and its receive a CTA spins `work` cycles (0, 1000, 2000, 4000: the GEMM or
softmax of the other warpgroup that would hide the exchange). Printed, one row a (mode, transport,
depth, lag, work): cycles a tile per CTA (the mean over CTAs of the timed loop / tiles), the cost
over the work (cycles a tile - work), and the wrong values received (`-` where nothing is read).
If send costs about what exchange does, the cost is per tile at the sender and no depth hides it;
if exchange at depth >= 2 or lag >= 1 falls towards send, it was latency. A wait that does not
finish within ~2 s traps, so a broken handshake ends the program instead of hanging it.
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

static void check(cudaError_t e, int line, const char* what) {
  if (e != cudaSuccess) { printf("CUDA error %s at %d (%s)\n", cudaGetErrorString(e), line, what); exit(1); }
}
#define CHECK(x) check((x), __LINE__, "")

constexpr int kThreads = 128, kFloats = 32, kTileFloats = kThreads * kFloats, kTileBytes = kTileFloats * 4;  // 64 x 64 fp32
constexpr int kMaxDepth = 8, kMaxStaging = 6;  // 8 receive + 6 staging tiles = 224 KB of the 227 KB a CTA may have
constexpr int kSmemBytes = (kMaxDepth + kMaxStaging) * kTileBytes;
constexpr long long kTimeoutCycles = 1LL << 32;  // ~2 s: far beyond any wait that will ever finish
enum Mode { kNone = 0, kSend = 1, kExchange = 2 };
enum Transport { kStores = 0, kBulk = 1 };

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ inline uint32_t peer_addr(uint32_t local, uint32_t peer) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(peer));
  return remote;
}
__device__ inline bool phase_done(uint32_t bar, int phase) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(bar), "r"(phase) : "memory");
  return done != 0;
}
__device__ inline void wait_phase(uint32_t bar, int phase) {
  if (phase_done(bar, phase)) return;  // the clock is read only when the first try times out
  const long long give_up = clock64() + kTimeoutCycles;
  while (!phase_done(bar, phase)) {
    if (clock64() > give_up) __trap();
  }
}
__device__ inline void arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote_bar) : "memory");
}
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ inline void sync_warpgroup() { asm volatile("bar.sync 1, %0;" ::"r"(kThreads) : "memory"); }
__device__ inline void spin(int cycles) {
  const long long until = clock64() + cycles;
  while (clock64() < until) {}
}
__device__ inline float value(uint32_t rank, int tile, int t, int i) {  // exact in fp32 below 2^24 (tiles <= 3800)
  return float(rank * 1000003u + uint32_t(tile) * 4099u + uint32_t(t * kFloats + i));
}

// Tile `tile` goes into the peer's receive slot tile % depth (and, for bulk, through my staging slot tile % reuse).
__global__ void __cluster_dims__(2, 1, 1) exchange_kernel(int tiles, int mode, int transport, int depth, int lag, int work,
                                                           long long* cycles, int* wrong) {
  extern __shared__ __align__(128) float buffers[];
  float* recv = buffers;                           // depth tiles, written by the peer
  float* staging = buffers + depth * kTileFloats;  // bulk: the tiles my copies read
  __shared__ __align__(8) uint64_t full[kMaxDepth], free_bar[kMaxDepth];
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const uint32_t peer = rank ^ 1u;
  const int t = threadIdx.x;
  const bool bulk = transport == kBulk;
  // Sending tile k reuses the peer's slot of tile k - depth and (bulk) my staging of tile k - reuse; a bulk copy's
  // source is known read only once the peer has the tile, so both wait for the peer to have freed tile k - reuse.
  const int reuse = bulk && depth > kMaxStaging ? kMaxStaging : depth;
  if (t == 0) {
    for (int s = 0; s < depth; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&full[s])), "r"(bulk ? 1 : kThreads));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&free_bar[s])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();
  float acc[kFloats];
  for (int i = 0; i < kFloats; ++i) acc[i] = 0.f;
  int bad = 0;
  const long long start = clock64();
  if (mode == kNone) {
    for (int tile = 0; tile < tiles; ++tile) spin(work);
  } else {
    const int steps = mode == kExchange ? tiles + lag : tiles;  // the last lag steps only receive
    for (int step = 0; step < steps; ++step) {
      if (step < tiles) {  // send tile `step`
        const int tile = step, slot = tile % depth;
        float mine[kFloats];
        for (int i = 0; i < kFloats; ++i) mine[i] = value(rank, tile, t, i);
        if (bulk && t == 0) {
          // My slot's next use expects the peer's tile of bytes (it may land first: the count goes negative a while).
          // Exchange: one arrival completes the phase with the bytes (the slot's last use was consumed at step
          // tile - depth + lag < step). Send: the bytes only, so no phase ends before the drain and the count stays
          // within a few tiles of zero.
          if (mode == kExchange) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                         ::"r"(smem_addr(&full[slot])), "r"(kTileBytes) : "memory");
          } else {
            asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;"
                         ::"r"(smem_addr(&full[slot])), "r"(kTileBytes) : "memory");
          }
        }
        if (mode == kExchange && tile >= reuse) {  // the peer has freed tile - reuse (frees come in order)
          const int freed = tile - reuse;
          wait_phase(smem_addr(&free_bar[freed % depth]), (freed / depth) & 1);
        }
        if (!bulk) {
          const uint32_t dst = peer_addr(smem_addr(&recv[slot * kTileFloats + t * kFloats]), peer);
          for (int i = 0; i < kFloats; i += 4) {
            asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(dst + i * 4), "f"(mine[i]), "f"(mine[i + 1]),
                         "f"(mine[i + 2]), "f"(mine[i + 3]) : "memory");
          }
          arrive_remote(peer_addr(smem_addr(&full[slot]), peer));
        } else {
          float* out = staging + (tile % reuse) * kTileFloats;
          for (int i = 0; i < kFloats; i += 4) {
            *reinterpret_cast<float4*>(&out[t * kFloats + i]) = make_float4(mine[i], mine[i + 1], mine[i + 2], mine[i + 3]);
          }
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the copy (async proxy) sees the stores
          sync_warpgroup();
          if (t == 0) {
            asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(peer_addr(smem_addr(&recv[slot * kTileFloats]), peer)), "r"(smem_addr(out)), "r"(kTileBytes),
                         "r"(peer_addr(smem_addr(&full[slot]), peer)) : "memory");
          }
        }
      }
      if (work > 0) spin(work);
      if (mode == kExchange && step >= lag) {  // receive tile step - lag
        const int tile = step - lag, slot = tile % depth;
        wait_phase(smem_addr(&full[slot]), (tile / depth) & 1);
        for (int i = 0; i < kFloats; i += 4) {
          const float4 v = *reinterpret_cast<const float4*>(&recv[slot * kTileFloats + t * kFloats + i]);
          bad += (v.x != value(peer, tile, t, i)) + (v.y != value(peer, tile, t, i + 1)) +
                 (v.z != value(peer, tile, t, i + 2)) + (v.w != value(peer, tile, t, i + 3));
          acc[i] += v.x; acc[i + 1] += v.y; acc[i + 2] += v.z; acc[i + 3] += v.w;
        }
        sync_warpgroup();  // every thread has read the slot
        if (t == 0) arrive_remote(peer_addr(smem_addr(&free_bar[slot]), peer));
      }
    }
  }
  const long long stop = clock64();
  if (mode == kSend && bulk && t == 0) {  // untimed drain: each slot's phase ends when every byte booked on it has landed
    for (int s = 0; s < depth; ++s) {
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(&full[s])) : "memory");
      wait_phase(smem_addr(&full[s]), 0);
    }
  }
  cluster_sync();  // neither CTA leaves while the other may still write into it or copy from it
  float sum = 0.f;
  for (int i = 0; i < kFloats; ++i) sum += acc[i];
  if (sum == 1234.5f) bad += 1000000;  // keeps the adds
  if (bad) atomicAdd(wrong, bad);
  if (t == 0) cycles[blockIdx.x] = stop - start;
}

struct Config { int mode, transport, depth, lag; };

int main() {
  const int ctas = 132, tiles = 2000;  // ~84 configurations x 2 launches x <= 10 ms
  long long* cycles; int* wrong;
  CHECK(cudaMalloc(&cycles, ctas * sizeof(long long)));
  CHECK(cudaMalloc(&wrong, sizeof(int)));
  std::vector<long long> host(ctas);
  const char* mode_names[3] = {"none", "send", "exchange"};
  const char* transport_names[2] = {"stores", "bulk"};
  // Every run reserves the most shared memory (one CTA an SM), so the smaller rings share no SM either.
  CHECK(cudaFuncSetAttribute(exchange_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  std::vector<Config> configs = {{kNone, kStores, 1, 0}};
  for (int transport = 0; transport < 2; ++transport) {
    configs.push_back({kSend, transport, kMaxDepth, 0});  // the most slots: the bulk drain's byte count stays smallest
    for (int depth : {1, 2, 4, 8}) {
      for (int lag = 0; lag <= 2 && lag + 1 <= depth; ++lag) configs.push_back({kExchange, transport, depth, lag});
    }
  }
  printf("%-8s %-9s %5s %3s %5s %9s %9s %6s\n", "mode", "transport", "depth", "lag", "work", "cyc/tile", "over work", "wrong");
  for (const Config& c : configs) {
    char depth[8] = "-", lag[8] = "-", bad[16] = "-";
    if (c.mode != kNone) snprintf(depth, sizeof depth, "%d", c.depth);
    if (c.mode == kExchange) snprintf(lag, sizeof lag, "%d", c.lag);
    for (int work : {0, 1000, 2000, 4000}) {
      char what[64];
      snprintf(what, sizeof what, "%s %s depth %d lag %d work %d", mode_names[c.mode], transport_names[c.transport], c.depth,
               c.lag, work);
      CHECK(cudaMemset(wrong, 0, sizeof(int)));
      for (int rep = 0; rep < 2; ++rep) {  // the first a warm-up
        exchange_kernel<<<ctas, kThreads, kSmemBytes>>>(tiles, c.mode, c.transport, c.depth, c.lag, work, cycles, wrong);
        check(cudaGetLastError(), __LINE__, what);
        check(cudaDeviceSynchronize(), __LINE__, what);
      }
      int host_wrong = 0;
      CHECK(cudaMemcpy(host.data(), cycles, ctas * sizeof(long long), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(&host_wrong, wrong, sizeof(int), cudaMemcpyDeviceToHost));
      double sum = 0;
      for (long long x : host) sum += double(x);
      const double per_tile = sum / ctas / tiles;
      if (c.mode == kExchange) snprintf(bad, sizeof bad, "%d", host_wrong);
      printf("%-8s %-9s %5s %3s %5d %9.0f %9.0f %6s\n", mode_names[c.mode], c.mode == kNone ? "-" : transport_names[c.transport],
             depth, lag, work, per_tile, per_tile - work, bad);
    }
  }
  return 0;
}
"""


def main() -> int:
    return build_and_run(SOURCE, "cluster_exchange_probe")


if __name__ == "__main__":
    sys.exit(main())
