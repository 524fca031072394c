// Every CTA's phases in global time, for a debug build (nvcc -DDDTREE_WAIT_CLOCKS, as the wait
// clocks: DDTREE_NVCC_EXTRA=-DDDTREE_WAIT_CLOCKS python -m bench.profile_case CASE --iters 1): a
// CTA's thread 0 stamps %globaltimer (ns, one clock for all SMs) when it passes the wait for the
// preparation, when its q is ready, when its pair loop is done and when its output is stored (the
// persistent kernel: its last segment's), and a one-thread launch after the kernel prints each
// phase's spread over the CTAs and the spans between phases. Where the wait clocks say how CTA 0
// spends its loop, this says where a launch's time goes beside the loop: a late start, a long
// prologue, CTAs that end late. Without the macro every call here compiles to nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

namespace ddtree::sm90 {

enum CtaPhase : int { kCtaEntry, kCtaQReady, kCtaLoopDone, kCtaStored, kCtaPhases };
// The kernels that stamp, as the printer names them.
enum TimelineKernel : int { kTimelineSplit, kTimelinePersistent, kTimelineTransposed };
constexpr int kTimelineCtas = 1024;  // CTAs past these are not stamped

#ifdef DDTREE_WAIT_CLOCKS
// Static, as the printer: each kernel source has its own copy, read by its own launch's printer.
static __device__ unsigned long long cta_stamps[kTimelineCtas][kCtaPhases];
static __device__ double cta_timeline_values[kTimelineCtas];  // the printer's scratch

// Min, median and max of n values, sorted in place (one thread; n <= kTimelineCtas).
static __device__ void print_spread(const char* kernel, const char* what, double* v, int n) {
  for (int i = 1; i < n; ++i) {
    const double x = v[i];
    int j = i - 1;
    for (; j >= 0 && v[j] > x; --j) v[j + 1] = v[j];
    v[j + 1] = x;
  }
  if (n > 0) {
    printf("wait_clocks timeline %s %s: min %.2f, median %.2f, max %.2f us over %d CTAs\n", kernel, what, v[0],
           v[n / 2], v[n - 1], n);
  }
}

// The CTAs that stored an output (all four stamps), from the earliest entry; then the stamps cleared.
static __global__ void print_cta_timeline(int ctas, int kernel_kind) {
  const char* const kernels[] = {"split", "persistent", "transposed"};
  const char* const kernel = kernels[kernel_kind];
  const char* const phases[kCtaPhases] = {"entry", "q ready", "loop done", "stored"};
  const char* const spans[kCtaPhases - 1] = {"span to q ready", "span pair loop", "span store"};
  double* const v = cta_timeline_values;
  auto& t = cta_stamps;
  ctas = ctas < kTimelineCtas ? ctas : kTimelineCtas;
  unsigned long long first = ~0ull;
  for (int c = 0; c < ctas; ++c) {
    if (t[c][kCtaStored] != 0 && t[c][kCtaEntry] < first) first = t[c][kCtaEntry];
  }
  for (int ph = 0; ph < kCtaPhases; ++ph) {
    int n = 0;
    for (int c = 0; c < ctas; ++c) {
      if (t[c][kCtaStored] != 0) v[n++] = 1e-3 * double(t[c][ph] - first);
    }
    print_spread(kernel, phases[ph], v, n);
  }
  for (int ph = 1; ph < kCtaPhases; ++ph) {
    int n = 0;
    for (int c = 0; c < ctas; ++c) {
      if (t[c][kCtaStored] != 0) v[n++] = 1e-3 * double(t[c][ph] - t[c][ph - 1]);
    }
    print_spread(kernel, spans[ph - 1], v, n);
  }
  for (int c = 0; c < ctas; ++c) {
    for (int ph = 0; ph < kCtaPhases; ++ph) t[c][ph] = 0;
  }
}
#endif

// Stamps phase `ph` of this CTA, from its thread 0 (every thread may call it: in a release build
// the call is nothing at all, not even a test of the thread's index, so the kernel stays as it is).
__device__ __forceinline__ void stamp_cta_phase(int ph) {
#ifdef DDTREE_WAIT_CLOCKS
  if (threadIdx.x == 0 && blockIdx.x < kTimelineCtas) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    cta_stamps[blockIdx.x][ph] = now;
  }
#else
  (void)ph;
#endif
}

// After a kernel of `ctas` CTAs, on its stream: the timeline printed (the debug build only).
static inline void print_cta_timeline_after(cudaStream_t stream, int ctas, TimelineKernel kernel) {
#ifdef DDTREE_WAIT_CLOCKS
  print_cta_timeline<<<1, 1, 0, stream>>>(ctas, kernel);
#else
  (void)stream, (void)ctas, (void)kernel;
#endif
}

}  // namespace ddtree::sm90
