// Host emulation of the CUDA features the preparation headers use: one block at a time, its
// threads as std::threads, barriers for __syncthreads and for warp votes.
#pragma once
#include <atomic>
#include <barrier>
#include <cstdint>
#include <climits>
#include <thread>
#include <vector>
#include <functional>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static

struct Dim3 { unsigned x = 1, y = 1, z = 1; };
inline thread_local Dim3 threadIdx, blockIdx;
inline Dim3 blockDim, gridDim;

struct EmuBlock {
  std::barrier<>* block_barrier;
  std::vector<std::barrier<>*> warp_barriers;
  int votes[1024];
  int block_votes[1024];
  long long lanes[1024];
};
inline EmuBlock* g_block = nullptr;

inline void __syncthreads() { g_block->block_barrier->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned __ballot_sync(unsigned, bool pred) {
  const int t = threadIdx.x, warp = t / 32;
  auto* bar = g_block->warp_barriers[warp];
  g_block->votes[t] = pred;
  bar->arrive_and_wait();
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l) bits |= unsigned(g_block->votes[warp * 32 + l] != 0) << l;
  bar->arrive_and_wait();
  return bits;
}
inline bool __all_sync(unsigned m, bool pred) { return __ballot_sync(m, pred) == 0xffffffffu; }
inline int __syncthreads_or(int pred) {
  g_block->block_votes[threadIdx.x] = pred;
  g_block->block_barrier->arrive_and_wait();
  int any = 0;
  for (unsigned t = 0; t < blockDim.x; ++t) any |= g_block->block_votes[t] != 0;
  g_block->block_barrier->arrive_and_wait();
  return any;
}
// Lane `source(lane)`'s value (its own where the source is outside the warp).
template <class T, class Source>
inline T emu_shuffle(T v, Source source) {
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  auto* bar = g_block->warp_barriers[warp];
  g_block->lanes[t] = static_cast<long long>(v);
  bar->arrive_and_wait();
  const int from = source(lane);
  const T got = from >= 0 && from < 32 ? static_cast<T>(g_block->lanes[warp * 32 + from]) : v;
  bar->arrive_and_wait();
  return got;
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int mask) { return emu_shuffle(v, [&](int lane) { return lane ^ mask; }); }
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned delta) {
  return emu_shuffle(v, [&](int lane) { return lane - static_cast<int>(delta); });
}
inline int __ffs(int x) { return __builtin_ffs(x); }
template <class T> inline T atomicMin(T* p, T v) { std::atomic_ref<T> a(*p); T o = a.load(); while (v < o && !a.compare_exchange_weak(o, v)) {} return o; }
template <class T> inline T atomicMax(T* p, T v) { std::atomic_ref<T> a(*p); T o = a.load(); while (v > o && !a.compare_exchange_weak(o, v)) {} return o; }
template <class T> inline T atomicOr(T* p, T v) { return std::atomic_ref<T>(*p).fetch_or(v); }
template <class T> inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
template <class T> inline T atomicExch(T* p, T v) { return std::atomic_ref<T>(*p).exchange(v); }

inline void emu_launch(int grid, int threads, const std::function<void()>& body) {
  gridDim.x = grid;
  blockDim.x = threads;
  for (int b = 0; b < grid; ++b) {
    std::barrier<> block_barrier(threads);
    EmuBlock blk;
    blk.block_barrier = &block_barrier;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    for (int w = 0; w < (threads + 31) / 32; ++w) {
      warps.emplace_back(new std::barrier<>(32));
      blk.warp_barriers.push_back(warps.back().get());
    }
    g_block = &blk;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t, b] { threadIdx.x = t; blockIdx.x = b; body(); });
    for (auto& th : pool) th.join();
  }
}
