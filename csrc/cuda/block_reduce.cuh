#pragma once
// In-block reduction trees, layered warp -> block.
//
// The seed trees (REDUCE-0..2) work in shared memory `sdata[0..blockDim.x)` and leave the block's sum in
// sdata[0]; each is the lesson's loop, nothing more. REDUCE-4/5 finish the last warp with shuffles, and
// warp_reduce/block_reduce are the shuffle-based building blocks shared by the full, row, column and
// LayerNorm reductions, templated over the combine operator (SumOp, MaxOp, MinOp, ...).
#include <cuda_runtime.h>

#include <type_traits>

#include "common/reduce_ops.h"

namespace torch_reduce::cuda {

constexpr unsigned kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------- seed trees (shared memory) ----

// REDUCE-0, interleaved addressing: the active threads thin out inside every warp (tid % (2*s) == 0).
template <typename T>
__device__ void tree_interleaved(T* sdata, unsigned tid) {
  for (unsigned s = 1; s < blockDim.x; s *= 2) {
    if (tid % (2 * s) == 0) sdata[tid] += sdata[tid + s];
    __syncthreads();
  }
}

// REDUCE-1, interleaved addressing with a strided index: the active threads are contiguous (no modulo,
// less divergence), but lanes 2*s apart in words now share banks.
template <typename T>
__device__ void tree_strided(T* sdata, unsigned tid) {
  for (unsigned s = 1; s < blockDim.x; s *= 2) {
    const unsigned index = 2 * s * tid;
    if (index + s < blockDim.x) sdata[index] += sdata[index + s];
    __syncthreads();
  }
}

// REDUCE-2, sequential addressing: the first s threads add the upper half onto the lower half.
template <typename T>
__device__ void tree_sequential(T* sdata, unsigned tid) {
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) sdata[tid] += sdata[tid + s];
    __syncthreads();
  }
}

// ---------------------------------------------------------------- warp and block (shuffles) ----

// A warp shuffle (`shuffle(number)`, e.g. a __shfl_down_sync) of a number, or of an accumulator struct (e.g.
// Welford's) field by field through its own `T::shuffled(v, shuffle)`, so every tree below works for both.
template <typename T, typename Shuffle>
__device__ __forceinline__ T shuffled(const T& v, Shuffle shuffle) {
  if constexpr (std::is_arithmetic_v<T>) {
    return shuffle(v);
  } else {
    return T::shuffled(v, shuffle);
  }
}

template <typename T>
__device__ __forceinline__ T shfl_down(const T& v, unsigned offset, unsigned width) {
  return shuffled(v, [=](auto x) { return __shfl_down_sync(kFullMask, x, offset, width); });
}

// The value of lane (this lane) ^ mask.
template <typename T>
__device__ __forceinline__ T shfl_xor(const T& v, unsigned mask) {
  return shuffled(v, [=](auto x) { return __shfl_xor_sync(kFullMask, x, mask); });
}

// Lane `source`'s value, in every lane of the warp.
template <typename T>
__device__ __forceinline__ T shfl_broadcast(const T& v, unsigned source) {
  return shuffled(v, [=](auto x) { return __shfl_sync(kFullMask, x, source); });
}

// Lane i combines lane i+offset, offsets WIDTH/2 .. 1: the same pairing as the sequential tree, so a
// warp reduced this way gives the bits the shared-memory loop would. The result is in lane 0 of each
// WIDTH-lane group.
template <unsigned WIDTH = kWarpSize, typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (unsigned offset = WIDTH / 2; offset > 0; offset >>= 1) v = op(v, shfl_down(v, offset, WIDTH));
  return v;
}

// REDUCE-4 (BLOCK == 0: block size read at run time) and REDUCE-5 (BLOCK a template parameter: the
// compiler unrolls every step) in one function: sequential addressing in shared memory down to 64
// partials, then the last warp by shuffles. Not the lesson's `volatile` warp-synchronous code: since
// Volta, the lanes of a warp are scheduled independently and may drift apart, so that code races;
// __shfl_down_sync exchanges the values and synchronises the named lanes in one instruction.
template <unsigned BLOCK = 0, typename T>
__device__ T tree_last_warp_shuffled(T* sdata, unsigned tid) {
  const unsigned block = BLOCK != 0 ? BLOCK : blockDim.x;
#pragma unroll
  for (unsigned s = block / 2; s > kWarpSize; s >>= 1) {
    if (tid < s) sdata[tid] += sdata[tid + s];
    __syncthreads();
  }
  T v = T(0);
  if (tid < kWarpSize) {
    v = sdata[tid];
    if (block > kWarpSize) v += sdata[tid + kWarpSize];
    v = warp_reduce(v, SumOp<T>());
  }
  return v;  // the block's sum, in thread 0
}

// Warp shuffles, then one warp folds the per-warp results: one barrier, BLOCK/32 shared words.
// Returns the block's reduction in thread 0. Call __syncthreads() before a second call in one kernel.
template <unsigned BLOCK, typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op) {
  static_assert(BLOCK % kWarpSize == 0 && BLOCK <= 1024, "block size must be a multiple of 32, at most 1024");
  constexpr unsigned kWarps = BLOCK / kWarpSize;
  v = warp_reduce(v, op);
  if constexpr (kWarps > 1) {
    __shared__ T warp_results[kWarps];
    const unsigned lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    if (lane == 0) warp_results[warp] = v;
    __syncthreads();
    if (warp == 0) v = warp_reduce<kWarpSize>(lane < kWarps ? warp_results[lane] : Op::identity(), op);
  }
  return v;
}

}  // namespace torch_reduce::cuda
