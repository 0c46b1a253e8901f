#pragma once
// The row machinery of var_mean, LayerNorm and RMSNorm on the GPU: rows of a contiguous (rows, cols) matrix, one
// group of threads per row: a warp for short rows (four rows a block), a block of 64..512 threads for
// longer ones (the smallest that holds the row), 1024 for the longest that registers hold. Thread t of a group
// holds the row's 16-byte vectors t, t + GROUP, ... in registers (RowRegisters), the same columns for every row it
// visits, and the group combines its threads' statistics with warp_reduce/block_reduce. Rows that are not 16-byte
// aligned, or too long for the registers, stream through full_reduce.cuh's thread_reduce instead.
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "common/dispatch.h"
#include "common/reduce_ops.h"
#include "cuda/block_reduce.cuh"
#include "cuda/full_reduce.cuh"
#include "cuda/tuning.h"

namespace torch_reduce::cuda {

template <typename scalar_t>
__device__ __forceinline__ void store_vector(Vec16<scalar_t>* p, const Vec16<scalar_t>& v) {
  uint4 raw;
  memcpy(&raw, &v, sizeof(raw));
  *reinterpret_cast<uint4*>(p) = raw;
}

// The elements of a 16-byte vector in acc_t. bfloat16 pairs are widened by a shift (the lower element) and a mask
// (the upper one): one instruction an element, where the conversion operator takes two for the upper element
// (a byte permute, then a shift). H200, the norm backward op alone, graph replay, two runs each alternating, against
// the conversion operator (with the backward's sum(g * (x - mean)) scaled by rstd once a row instead of per
// element): 0.99-1.06x over 32 LayerNorm/RMSNorm cases (geomean 1.01; bfloat16 LayerNorm 65536x1024 125.8 ->
// 118.4 us, 16384x1600 61.8 -> 58.2), where an earlier round had measured the backward 0.80-1.08x and the forward
// 1.05x (median) from the same widening.
template <typename acc_t, typename scalar_t>
__device__ __forceinline__ void widen(const Vec16<scalar_t>& v, acc_t (&out)[Vec16<scalar_t>::kSize]) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16> && std::is_same_v<acc_t, float>) {
    uint32_t words[4];
    memcpy(words, &v, sizeof(words));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      out[2 * w] = __uint_as_float(words[w] << 16);
      out[2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int e = 0; e < Vec16<scalar_t>::kSize; ++e) out[e] = static_cast<acc_t>(v.value[e]);
  }
}

// The N parameters (weight or bias) of elements first .. first + N - 1, in acc_t: one 16-byte load when they
// have the input's dtype, two when they are float32 beside a 16-bit input (mixed precision).
template <int N, typename acc_t, typename param_t>
__device__ __forceinline__ void load_params(const param_t* p, int64_t first, acc_t (&out)[N]) {
  constexpr int kPerLoad = Vec16<param_t>::kSize;
  static_assert(N % kPerLoad == 0, "a parameter vector is one or more 16-byte loads");
  const auto* v = reinterpret_cast<const Vec16<param_t>*>(p + first);
#pragma unroll
  for (int l = 0; l < N / kPerLoad; ++l) {
    acc_t widened[kPerLoad];
    widen(load_vector(v + l), widened);
#pragma unroll
    for (int e = 0; e < kPerLoad; ++e) out[l * kPerLoad + e] = widened[e];
  }
}

// A group (GROUP) or block (BLOCK) size of kAnyBlock: the group is the whole block, of any multiple of 32 threads
// up to 1024, set at launch (blockDim.x), so that a row's threads need not be a power of two.
inline constexpr unsigned kAnyBlock = 0;

template <unsigned GROUP>
__device__ __forceinline__ unsigned group_threads() {
  return GROUP == kAnyBlock ? blockDim.x : GROUP;
}

// Whether combining two T divides (Welford runs): a chain of such combines is slow to wait on.
template <typename T>
struct CombineDivides : std::false_type {};
template <typename A>
struct CombineDivides<Welford<A>> : std::true_type {};

// The reduction of a GROUP-thread group (one warp, or the whole block), returned to every thread of it: a group's
// rows call it once a row. Every thread of a block of a fixed size folds the block's warp results from shared
// memory in warp order (a shuffle tree over them, then a broadcast, is a chain of shuffles the row waits on); a
// block of a run-time size, or results whose combine divides, fold in a tree, each warp alike (a loop over a
// run-time count would wait on each load; 15 Welford combines in a row, on each other: LayerNorm float32 2048x18432
// forward 109 -> 125 us on the H200). Every thread gets the same bits. One barrier a call: the warp results of
// successive calls alternate between two shared buffers, so a call's writes never meet the reads of the call before
// (every thread read those before it reached the barrier in between). The buffers belong to the type: one object
// per kernel. It replaced three barriers a call (block_reduce, then thread 0's result through shared memory):
// LayerNorm and RMSNorm backward on the H200, graph replay, 0-5% shorter at most shapes (within the +-4% two runs
// differ by), 4-14% at hidden 8192-18432 (float32 16384x12288: 688 -> 603 us).
template <unsigned GROUP, unsigned BLOCK, typename T>
class GroupAllreduce {
  static_assert(GROUP == kWarpSize || GROUP == BLOCK, "a group is one warp or the whole block");
  unsigned buffer_ = 0;

 public:
  template <typename Op>
  __device__ __forceinline__ T operator()(T v, Op op) {
    v = warp_reduce(v, op);
    if constexpr (GROUP != kWarpSize) {
      constexpr unsigned kMaxWarps = (GROUP == kAnyBlock ? 1024 : GROUP) / kWarpSize;
      __shared__ T warp_results[2][kMaxWarps];
      const unsigned lane = threadIdx.x % kWarpSize, warps = group_threads<GROUP>() / kWarpSize;
      if (lane == 0) warp_results[buffer_][threadIdx.x / kWarpSize] = v;
      __syncthreads();
      if constexpr (CombineDivides<T>::value) {
        v = shfl_broadcast(warp_reduce(lane < warps ? warp_results[buffer_][lane] : Op::identity(), op), 0);
      } else if constexpr (GROUP == kAnyBlock) {
        // A butterfly over the warp results, padded to a power of two (`span`) and repeated across the warp's
        // lanes: log2(span) steps and no broadcast, where the tree takes five and one. Partners compute
        // op(a, b) and op(b, a), the same bits for these plain sums (not for Welford's combine, above).
        const unsigned span = warps > 1 ? 2u << (31 - __clz(warps - 1)) : 1u, w = lane & (span - 1);
        v = w < warps ? warp_results[buffer_][w] : Op::identity();
        for (unsigned offset = 1; offset < span; offset <<= 1) v = op(v, shfl_xor(v, offset));
      } else {
        v = warp_results[buffer_][0];
#pragma unroll
        for (unsigned w = 1; w < warps; ++w) v = op(v, warp_results[buffer_][w]);
      }
      buffer_ ^= 1;
      return v;
    } else {
      return shfl_broadcast(v, 0);
    }
  }
};

// The same, for a kernel that calls it once (its groups reduce one row each).
template <unsigned GROUP, unsigned BLOCK, typename T, typename Op>
__device__ __forceinline__ T group_allreduce(T v, Op op) {
  return GroupAllreduce<GROUP, BLOCK, T>()(v, op);
}

// A thread's share of a row in registers: vectors t, t + GROUP, ..., at most ITEMS of them.
template <typename scalar_t, int ITEMS>
struct RowRegisters {
  Vec16<scalar_t> v[ITEMS];
};

// Makes the compiler treat the packed words as new values, so a later pass converts 16-bit elements again
// (one instruction each) instead of keeping every converted float alive in between: twice the registers.
template <typename scalar_t, int ITEMS>
__device__ __forceinline__ void repack(RowRegisters<scalar_t, ITEMS>& regs) {
  if constexpr (sizeof(scalar_t) == 2) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      auto* words = reinterpret_cast<uint32_t*>(regs.v[k].value);
#pragma unroll
      for (int w = 0; w < 4; ++w) asm volatile("" : "+r"(words[w]));
    }
  }
}

template <unsigned GROUP, typename scalar_t, int ITEMS>
__device__ __forceinline__ void load_row(RowRegisters<scalar_t, ITEMS>& regs, const scalar_t* row, int64_t vectors,
                                         unsigned t) {
  const auto* vrow = reinterpret_cast<const Vec16<scalar_t>*>(row);
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t i = t + static_cast<int64_t>(k) * group_threads<GROUP>();
    if (i < vectors) regs.v[k] = load_vector(vrow + i);
  }
}

// The fused residual add of add_layer_norm / add_rms_norm on a thread's vectors of a row in registers:
// regs = x + residual, rounded to scalar_t as torch's x + r rounds it, and stored to `sum`.
template <unsigned GROUP, typename acc_t, typename scalar_t, int ITEMS>
__device__ __forceinline__ void add_residual(RowRegisters<scalar_t, ITEMS>& regs, const scalar_t* residual,
                                             scalar_t* sum, int64_t vectors, unsigned t) {
  using V = Vec16<scalar_t>;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t i = t + static_cast<int64_t>(k) * GROUP;
    if (i >= vectors) continue;
    acc_t xf[V::kSize], rf[V::kSize];
    widen(regs.v[k], xf);
    widen(load_vector(reinterpret_cast<const V*>(residual) + i), rf);
#pragma unroll
    for (int e = 0; e < V::kSize; ++e) regs.v[k].value[e] = static_cast<scalar_t>(xf[e] + rf[e]);
    store_vector(reinterpret_cast<V*>(sum) + i, regs.v[k]);
  }
}

// Every thread of a GROUP-thread group (a warp or the whole block) waits for the others; their global and
// shared memory writes before it are visible to the group after it.
template <unsigned GROUP>
__device__ __forceinline__ void group_sync() {
  if constexpr (GROUP == kWarpSize) {
    __syncwarp();
  } else {
    __syncthreads();
  }
}

// The statistics of a group's row, returned to every thread of the group. From registers (which the caller
// has loaded with load_row): two plain sums over the group, of x - x0 and then of (x - mean)^2, x0 the row's
// first element (`first`, which every thread reads): a float32 sum of a few values near 3e38 does not overflow
// (then NaN statistics), and a constant row's mean is exact, so its variance is exactly 0 (as torch's Welford
// gives). Streamed rows: Welford runs through thread_reduce, combined over the group with WelfordOp.
// Two sums instead of one Welford combine: each shuffle step of a Welford combine divides, and the row waits
// on its steps one after another. H200, graph replay, against the Welford combine (the run before): var_mean
// bfloat16 1.01-1.21x (median 1.09x, 65536x768 40.3 -> 34.6 us), float32 0.98-1.18x (median 1.01x); LayerNorm
// forward at 1024 rows 1.12-1.26x (float32 1024x768 4.9 -> 3.9 us), over its grid a median 1.00x (float32) and
// 1.04x (bfloat16), some shapes 5-8% slower (float32 4096x1024 9.4 -> 10.2 us), not explained.
// One reduction instead of the two, where every thread holds as many vectors (each thread's mean and m2 of its own
// elements from its registers first, then Chan's combine of equal runs over the group: halves, no division), lost
// (H200, graph replay, the ops alone, 20 cases, two runs a build, alternating): LayerNorm forward 0.94-1.01x (geomean
// 0.98; float32 1024x1024 3.87 -> 4.10 us), var_mean 0.90-1.06x (geomean 0.97; float32 4096x1024 6.55 -> 7.12), the
// same against Liger-Kernel (bfloat16 4096x4096 24.2 and 25.0 us, Liger 21.5): the row does not wait on its second
// reduction (benchmarks/results/nvidia-h200/logs/ab_equal_runs_stats.jsonl).
template <unsigned GROUP, unsigned BLOCK, bool kInRegisters, typename acc_t, typename scalar_t, int ITEMS>
__device__ __forceinline__ Welford<acc_t> row_stats(const scalar_t* row, scalar_t first, int64_t cols, unsigned t,
                                                    RowRegisters<scalar_t, ITEMS>& regs) {
  if constexpr (kInRegisters) {
    constexpr int kSize = Vec16<scalar_t>::kSize;
    const int64_t vectors = cols / kSize;
    const acc_t first_value = static_cast<acc_t>(first);
    const acc_t x0 = isfinite(first_value) ? first_value : acc_t(0);  // inf - inf would make a row of infs' mean NaN
    acc_t shifted = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (t + static_cast<int64_t>(k) * GROUP < vectors) {
        acc_t xf[kSize];
        widen(regs.v[k], xf);
#pragma unroll
        for (int e = 0; e < kSize; ++e) shifted += xf[e] - x0;
      }
    }
    GroupAllreduce<GROUP, BLOCK, acc_t> allreduce;
    const acc_t mean = x0 + allreduce(shifted, SumOp<acc_t>()) / static_cast<acc_t>(cols);
    repack(regs);
    acc_t m2 = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (t + static_cast<int64_t>(k) * GROUP < vectors) {
        acc_t xf[kSize];
        widen(regs.v[k], xf);
#pragma unroll
        for (int e = 0; e < kSize; ++e) {
          const acc_t d = xf[e] - mean;
          m2 += d * d;
        }
      }
    }
    return Welford<acc_t>(mean, allreduce(m2, SumOp<acc_t>()), static_cast<acc_t>(cols));
  } else {
    return group_allreduce<GROUP, BLOCK>(thread_reduce<Welford<acc_t>>(row, cols, t, GROUP, WelfordOp<acc_t>()),
                                         WelfordOp<acc_t>());
  }
}

// A thread's sum of squares of its share of row[0, cols) (RMSNorm's statistic), from registers (loaded by the
// caller) or streamed through thread_reduce.
template <unsigned GROUP, bool kInRegisters, typename acc_t, typename scalar_t, int ITEMS>
__device__ __forceinline__ acc_t thread_sum_squares(const scalar_t* row, int64_t cols, unsigned t,
                                                    RowRegisters<scalar_t, ITEMS>& regs) {
  if constexpr (kInRegisters) {
    constexpr int kSize = Vec16<scalar_t>::kSize;
    const int64_t vectors = cols / kSize;
    acc_t squares = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (t + static_cast<int64_t>(k) * GROUP < vectors) {
        acc_t xf[kSize];
        widen(regs.v[k], xf);
#pragma unroll
        for (int e = 0; e < kSize; ++e) squares += xf[e] * xf[e];
      }
    }
    return squares;
  } else {
    return thread_reduce<acc_t>(row, cols, t, GROUP, unprojected(NormTwoOp<acc_t>()));
  }
}

inline bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls launch(group, block, in_registers, grid) for a (rows, cols) matrix whose threads hold up to ITEMS
// vectors of a row: the first three compile-time constants, grid covering the rows one group each.
// aligned: every pointer the kernel reads or writes with vectors is 16-byte aligned. resident_threads: how
// many threads of the kernel the GPU holds at once. A thread takes as few vectors as keep that many threads
// busy (ITEMS when the rows fill the GPU), so that few rows spread over more threads and more of their
// loads are in flight at once, where that makes blocks of Tuning::kSpreadMinBlock threads or more. A row's
// group is a warp where 32 threads hold it, else the smallest power-of-two block in [MIN_BLOCK,
// Tuning::kMaxRowBlock] that does, else a block of Tuning::kWideRowBlock. Rows that are not aligned or do not
// fit stream (in_registers false): a warp a row where a warp's threads hold STREAM_ITEMS vectors of it, else a block.
template <typename Tuning, typename scalar_t, int ITEMS, unsigned MIN_BLOCK, int STREAM_ITEMS = ITEMS, typename F>
void with_row_layout(int64_t rows, int64_t cols, bool aligned, int64_t resident_threads, F&& launch) {
  constexpr unsigned kWarpRowsBlock = Tuning::kWarpRowsBlock, kMaxRowBlock = Tuning::kMaxRowBlock;
  using Warp = std::integral_constant<unsigned, kWarpSize>;
  using WarpBlock = std::integral_constant<unsigned, kWarpRowsBlock>;
  using Streaming = std::integral_constant<unsigned, Tuning::kStreamingBlock>;
  constexpr int64_t kSize = Vec16<scalar_t>::kSize, kWarpRowElements = int64_t{kWarpSize} * STREAM_ITEMS * kSize;
  TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(), "torch_reduce: too many rows for one launch: ", rows);
  const int64_t warp_grid = (rows + kWarpRowsBlock / kWarpSize - 1) / (kWarpRowsBlock / kWarpSize);
  const int64_t vectors = cols / kSize;
  if (aligned && cols % kSize == 0 && vectors <= int64_t{kMaxRowBlock} * ITEMS) {
    const int64_t busy = (rows * vectors + resident_threads - 1) / std::max<int64_t>(resident_threads, 1);
    const int64_t fewest = std::max<int64_t>(1, (vectors + kMaxRowBlock - 1) / kMaxRowBlock);
    const int64_t per_thread = std::clamp<int64_t>(busy, fewest, ITEMS);
    int64_t threads_needed = (vectors + per_thread - 1) / per_thread;
    if (threads_needed <= Tuning::kSpreadMinBlock / 2) threads_needed = (vectors + ITEMS - 1) / ITEMS;
    if (threads_needed <= kWarpSize) return launch(Warp(), WarpBlock(), std::true_type(), warp_grid);
    return with_power_of_two<MIN_BLOCK, kMaxRowBlock>(threads_needed, [&](auto block) {
      launch(block, block, std::true_type(), rows);
    });
  }
  if (aligned && cols % kSize == 0 && vectors <= int64_t{Tuning::kWideRowBlock} * ITEMS) {
    using Wide = std::integral_constant<unsigned, Tuning::kWideRowBlock>;
    return launch(Wide(), Wide(), std::true_type(), rows);
  }
  if (cols <= kWarpRowElements) return launch(Warp(), WarpBlock(), std::false_type(), warp_grid);
  launch(Streaming(), Streaming(), std::false_type(), rows);
}

}  // namespace torch_reduce::cuda
