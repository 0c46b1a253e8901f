#pragma once
// The CPU kernels' loops compiled twice: for the build's baseline x86-64 vectors (SSE2: 4 floats, 2 doubles)
// and for AVX2 (8 floats, 4 doubles), chosen at run time by the CPU. Only AVX2 is enabled in the second copy, not
// FMA, so no multiply-add is contracted and both copies do the same operations in the same order: the same bits on
// every x86-64 CPU. TORCH_REDUCE_CPU_CAPABILITY=default keeps the baseline copy (as torch's ATEN_CPU_CAPABILITY).
// One thread, two interleaved runs each, baseline -> AVX2 (torch): LayerNorm forward 512x1024 435-683 -> 219-310 us
// (232-269), 8x1024 10.3-12.3 -> 5.9-9.3 (6.8-9.4); its backward 256x1024 500-597 -> 257-356; RMSNorm forward
// 256x1024 200-300 -> 91-116 (199-394); amax of 2^18 floats 86-121 -> 38-49 (25-28); sum over dim 0 of (4096, 64)
// 56-73 -> 32-37 (13-20). The model of the GPU's full sum (cpu/model.h) gained nothing from this copy; its float32
// fold has an AVX2 loop of its own (fold_vectors_into).
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace torch_reduce::cpu {

#if defined(__x86_64__) && defined(__GNUC__)
// flatten: everything f calls is inlined into this copy (recursively), so it is compiled for AVX2 too.
template <typename F, typename... Args>
__attribute__((target("avx2"), flatten)) void run_avx2(const F& f, Args... args) {
  f(args...);
}

inline bool use_avx2() {
  static const bool use = [] {
    const char* capability = std::getenv("TORCH_REDUCE_CPU_CAPABILITY");
    return __builtin_cpu_supports("avx2") && (capability == nullptr || std::strcmp(capability, "default") != 0);
  }();
  return use;
}
#endif

// f(args...) in the copy for the best vectors this CPU has.
template <typename F, typename... Args>
void with_best_vectors(const F& f, Args... args) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (use_avx2()) return run_avx2(f, args...);
#endif
  f(args...);
}

// at::parallel_for with each task's f(begin, end) in the best copy.
template <typename F>
void parallel_for_best_vectors(int64_t begin, int64_t end, int64_t grain, const F& f) {
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { with_best_vectors(f, b, e); });
}

}  // namespace torch_reduce::cpu
