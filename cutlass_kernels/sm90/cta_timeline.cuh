// Every CTA's phases in global time, for a debug build (nvcc -DDDTREE_WAIT_CLOCKS, as the wait
// clocks: DDTREE_NVCC_EXTRA=-DDDTREE_WAIT_CLOCKS python -m bench.profile_case CASE --iters 1): a
// CTA stamps %globaltimer (ns, one clock for all SMs) at its phases (CtaPhase: e.g. when it passes
// the wait for the preparation, when its q is ready, when its pair loop is done and when its
// output is stored; the persistent kernel: its last segment's), and a one-thread launch after the
// kernel prints each phase's spread over the CTAs and the spans between phases. Where the wait clocks say how CTA 0
// spends its loop, this says where a launch's time goes beside the loop: a late start, a long
// prologue, CTAs that end late. Without the macro every call here compiles to nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

namespace ddtree::sm90 {

// In time order. The bf16 kernels stamp entry, q ready, loop done and stored; the transposed kernel
// every phase (its launch, before the wait for the preparation: the overlap with it; q issued by the
// gather and landed for the GEMM threads; its first pair done: the cold start of the loop).
enum CtaPhase : int {
  kCtaLaunch, kCtaEntry, kCtaQIssued, kCtaQLanded, kCtaQReady, kCtaFirstPair, kCtaLoopDone, kCtaStored, kCtaPhases
};
// The kernels that stamp, as the printer names them.
enum TimelineKernel : int { kTimelineSplit, kTimelinePersistent, kTimelineTransposed };
constexpr int kTimelineCtas = 1024;  // CTAs past these are not stamped

#ifdef DDTREE_WAIT_CLOCKS
// Static, as the printer: each kernel source has its own copy, read by its own launch's printer.
static __device__ unsigned long long cta_stamps[kTimelineCtas][kCtaPhases];
static __device__ double cta_timeline_values[kTimelineCtas];  // the printer's scratch

// Min, median and max of n values, sorted in place (one thread; n <= kTimelineCtas), as phase
// `what`, or as the span from phase `what` to phase `to` where `to` is given.
static __device__ void print_spread(const char* kernel, const char* what, const char* to, double* v, int n) {
  for (int i = 1; i < n; ++i) {
    const double x = v[i];
    int j = i - 1;
    for (; j >= 0 && v[j] > x; --j) v[j + 1] = v[j];
    v[j + 1] = x;
  }
  if (n > 0) {
    printf("wait_clocks timeline %s %s%s%s%s: min %.2f, median %.2f, max %.2f us over %d CTAs\n", kernel,
           to ? "span " : "", what, to ? " to " : "", to ? to : "", v[0], v[n / 2], v[n - 1], n);
  }
}

// The CTAs that stored an output, each phase that any of them stamped, from the earliest entry
// (a launch is before it); then the spans between consecutive stamped phases, and the stamps cleared.
static __global__ void print_cta_timeline(int ctas, int kernel_kind) {
  const char* const kernels[] = {"split", "persistent", "transposed"};
  const char* const kernel = kernels[kernel_kind];
  const char* const phases[kCtaPhases] = {"launch", "entry", "q issued", "q landed", "q ready", "first pair", "loop done",
                                          "stored"};
  double* const v = cta_timeline_values;
  auto& t = cta_stamps;
  ctas = ctas < kTimelineCtas ? ctas : kTimelineCtas;
  unsigned long long first = ~0ull;
  bool stamped[kCtaPhases] = {};
  for (int c = 0; c < ctas; ++c) {
    if (t[c][kCtaStored] == 0) continue;
    if (t[c][kCtaEntry] < first) first = t[c][kCtaEntry];
    for (int ph = 0; ph < kCtaPhases; ++ph) stamped[ph] = stamped[ph] || t[c][ph] != 0;
  }
  // Phase ph's spread over the CTAs, from phase `from`'s stamp (-1: from the earliest entry).
  auto print_phase = [&](int from, int ph) {
    int n = 0;
    for (int c = 0; c < ctas; ++c) {
      if (t[c][kCtaStored] != 0) v[n++] = 1e-3 * double(static_cast<long long>(t[c][ph] - (from < 0 ? first : t[c][from])));
    }
    print_spread(kernel, phases[from < 0 ? ph : from], from < 0 ? nullptr : phases[ph], v, n);
  };
  for (int ph = 0; ph < kCtaPhases; ++ph) {
    if (stamped[ph]) print_phase(-1, ph);
  }
  for (int from = -1, to = 0; to < kCtaPhases; ++to) {
    if (!stamped[to]) continue;
    if (from >= 0) print_phase(from, to);
    from = to;
  }
  for (int c = 0; c < ctas; ++c) {
    for (int ph = 0; ph < kCtaPhases; ++ph) t[c][ph] = 0;
  }
}
#endif

// Stamps phase `ph` of this CTA, from its thread `thread` (every thread may call it: in a release
// build the call is nothing at all, not even a test of the thread's index, so the kernel stays as it is).
__device__ __forceinline__ void stamp_cta_phase(int ph, unsigned thread = 0) {
#ifdef DDTREE_WAIT_CLOCKS
  if (threadIdx.x == thread && blockIdx.x < kTimelineCtas) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    cta_stamps[blockIdx.x][ph] = now;
  }
#else
  (void)ph, (void)thread;
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
