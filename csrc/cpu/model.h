#pragma once
// CPU models of the GPU kernels: the same trees and the same order of operations for every simulated thread,
// so that a float32 result is bit for bit what the GPU computes. Read next to csrc/cuda/block_reduce.cuh and
// full_reduce.cuh.
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "cpu/isa.h"

#include "common/reduce_ops.h"
#include "model_gpu.h"

namespace torch_reduce::cpu {

constexpr int64_t kWarpSize = 32;

// ------------------------------------------------------------------ seed trees, one block ----
// One step of a tree updates disjoint slots, so visiting the threads in order gives the GPU's bits.

template <typename T>
void tree_interleaved(T* sdata, int64_t block) {  // REDUCE-0
  for (int64_t s = 1; s < block; s *= 2)
    for (int64_t tid = 0; tid < block; ++tid)
      if (tid % (2 * s) == 0) sdata[tid] += sdata[tid + s];
}

template <typename T>
void tree_strided(T* sdata, int64_t block) {  // REDUCE-1
  for (int64_t s = 1; s < block; s *= 2)
    for (int64_t tid = 0; tid < block; ++tid) {
      const int64_t index = 2 * s * tid;
      if (index + s < block) sdata[index] += sdata[index + s];
    }
}

// REDUCE-2, and the order of REDUCE-4/5 too: a shuffle-down by s pairs lane i with lane i+s, exactly
// like the step `if (tid < s) sdata[tid] += sdata[tid + s]`.
template <typename T, typename Op = SumOp<T>>
void tree_sequential(T* sdata, int64_t block, Op op = Op()) {
  for (int64_t s = block / 2; s > 0; s >>= 1)
    for (int64_t tid = 0; tid < s; ++tid) sdata[tid] = op(sdata[tid], sdata[tid + s]);
}

// block_reduce: each warp by shuffles, then warp 0 over the per-warp results (identity-padded to 32).
template <typename T, typename Op>
T block_reduce(std::vector<T>& values, Op op) {
  const int64_t block = static_cast<int64_t>(values.size());
  for (int64_t w = 0; w < block; w += kWarpSize) tree_sequential(values.data() + w, kWarpSize, op);
  if (block == kWarpSize) return values[0];
  std::array<T, kWarpSize> warp_results;  // on the stack: no allocation a block
  warp_results.fill(Op::identity());
  for (int64_t w = 0; w < block / kWarpSize; ++w) warp_results[w] = values[w * kWarpSize];
  tree_sequential(warp_results.data(), kWarpSize, op);
  return warp_results[0];
}

}  // namespace torch_reduce::cpu

namespace torch_reduce::cpu {

// ------------------------------------------------ full_reduce.cuh's vector kernel, one thread at a time ----

constexpr int64_t kUnroll = kVectorUnroll;

template <typename acc_t, typename scalar_t, typename Op>
acc_t fold_vector(const scalar_t* v, Op op) {
  constexpr int64_t kSize = 16 / sizeof(scalar_t);
  if constexpr (kSize == 4) {
    // The same tree written out, so that GCC vectorizes block_thread_results' loop over a block's threads
    // (float32 sum of 2^18, one thread: 122-145 -> 48-74 us; 16-bit vectors of 8 ran slower that way).
    return op(op(static_cast<acc_t>(v[0]), static_cast<acc_t>(v[2])),
              op(static_cast<acc_t>(v[1]), static_cast<acc_t>(v[3])));
  } else {
    acc_t x[kSize];
    for (int64_t k = 0; k < kSize; ++k) x[k] = static_cast<acc_t>(v[k]);
    for (int64_t s = kSize / 2; s > 0; s /= 2)
      for (int64_t k = 0; k < s; ++k) x[k] = op(x[k], x[k + s]);
    return x[0];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// fold_vectors_into's float32 sum, eight threads at a time in AVX2: a[t] += (v0 + v2) + (v1 + v3) of thread t's
// vector, fold_vector's tree. Returns how many threads it took (a multiple of 8).
__attribute__((target("avx2"))) inline int64_t fold_float_vectors_avx2(float* a, const float* v, int64_t count) {
  int64_t t = 0;
  for (; t + 8 <= count; t += 8) {
    const float* p = v + t * 4;  // threads t .. t + 7, two vectors a register
    const __m256 r0 = _mm256_loadu_ps(p), r1 = _mm256_loadu_ps(p + 8), r2 = _mm256_loadu_ps(p + 16),
                 r3 = _mm256_loadu_ps(p + 24);
    // Each 128-bit lane pairs a vector's halves: [v0 + v2, v1 + v3] of threads (t, t+2 | t+1, t+3), then of
    // (t+4, t+6 | t+5, t+7).
    const __m256 h0 = _mm256_add_ps(_mm256_shuffle_ps(r0, r1, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(r0, r1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 h1 = _mm256_add_ps(_mm256_shuffle_ps(r2, r3, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(r2, r3, _MM_SHUFFLE(3, 2, 3, 2)));
    // (v0 + v2) + (v1 + v3), lanes holding threads t, t+2, t+4, t+6 | t+1, t+3, t+5, t+7; then in thread order.
    const __m256 folded = _mm256_add_ps(_mm256_shuffle_ps(h0, h1, _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm256_shuffle_ps(h0, h1, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m256 ordered = _mm256_permutevar8x32_ps(folded, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_ps(a + t, _mm256_add_ps(_mm256_loadu_ps(a + t), ordered));
  }
  return t;
}
#endif

// a[t] = op(a[t], fold_vector(v + t * kSize)) for t in [0, count): the inner loop of the model. A float32 sum
// takes eight threads at a time where the CPU has AVX2 (GCC's own vectorization of the loop below, SSE2 in the
// baseline build, spent 1.4 instructions an element). torch_reduce.sum of float32 on one core of this project's
// 2-core CPU, its time over torch.sum's in the same process (minimum over runs, four runs), before -> after:
// 2^10 1.2-1.4 -> 0.6-1.35, 2^14 2.0-2.2 -> 1.4-2.5, 2^16 2.9-3.5 -> 2.0-2.4, 2^20 1.1-1.7 -> 1.2-1.5.
template <typename acc_t, typename scalar_t, typename Op>
void fold_vectors_into(acc_t* a, const scalar_t* v, int64_t count, Op op) {
  constexpr int64_t kSize = 16 / sizeof(scalar_t);
  int64_t t = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<acc_t, float> && std::is_same_v<scalar_t, float> &&
                std::is_base_of_v<SumOp<float>, Op>) {
    if (use_avx2()) t = fold_float_vectors_avx2(a, v, count);
  }
#endif
  for (; t < count; ++t) a[t] = op(a[t], fold_vector<acc_t>(v + t * kSize, op));
}

// The results of block b's threads in one launch of device_reduce_kernel (thread_reduce in full_reduce.cuh)
// of `grid` blocks, into values[0, block). Thread T of the grid's G loads vectors T, T + G, ...: kUnroll at a
// time into accumulators 0 .. kUnroll - 1 while a whole round of kUnroll * G vectors fits, the rest into
// accumulator 0, then its head and tail elements into 1 and 2. The loops walk the block's vectors of a round in
// memory order (one contiguous run per accumulator); each thread's accumulators still take its vectors in the
// GPU's order, so the results are the GPU's bits: only the interleaving across threads, which no result depends
// on, differs from running one simulated thread after another.
template <typename acc_t, typename scalar_t, typename Op>
void block_thread_results(const scalar_t* in, int64_t n, int64_t b, int64_t block, int64_t grid, Op op,
                          std::vector<acc_t>& acc, std::vector<acc_t>& values) {
  static_assert(kUnroll == 4, "a thread's result folds its four accumulators as full_reduce.cuh does");
  constexpr int64_t kSize = 16 / sizeof(scalar_t);
  const int64_t misaligned = static_cast<int64_t>((reinterpret_cast<uintptr_t>(in) % 16) / sizeof(scalar_t));
  const int64_t head = misaligned == 0 ? 0 : std::min(kSize - misaligned, n);
  const int64_t vectors = (n - head) / kSize, tail = n - head - vectors * kSize;
  const scalar_t* body = in + head;
  const int64_t threads = grid * block, first = b * block;  // the block's threads: first .. first + block - 1
  acc.assign(kUnroll * block, Op::identity());  // [accumulator][thread of the block]
  const auto add = [&](int64_t t, int64_t k, acc_t v) {
    acc_t& a = acc[k * block + t];
    a = op(a, v);
  };
  const int64_t round = kUnroll * threads;
  int64_t base = 0;
  for (; base + round <= vectors; base += round) {
    for (int64_t k = 0; k < kUnroll; ++k) {
      fold_vectors_into(acc.data() + k * block, body + (base + k * threads + first) * kSize, block, op);
    }
  }
  // The last, partial round: threads whose kUnroll vectors all exist take them; the others fall through to the
  // one-vector loop, from vector base + T on, into accumulator 0. Per step of i, the block's threads t < split
  // take accumulator k and the rest accumulator 0 (a 2^10-element sum has no whole round).
  const int64_t unrolled = vectors - base - (kUnroll - 1) * threads;  // threads below this take a whole round
  for (int64_t i = base + first; i < vectors; i += threads) {
    const int64_t k = (i - base) / threads, count = std::min(block, vectors - i);
    const int64_t split = std::clamp<int64_t>(unrolled - first, 0, count);
    const scalar_t* v = body + i * kSize;
    fold_vectors_into(acc.data() + k * block, v, split, op);
    fold_vectors_into(acc.data() + split, v + split * kSize, count - split, op);
  }
  for (int64_t j = 0; j < head; ++j) {
    if (j % threads / block == b) add(j % threads - first, 1, static_cast<acc_t>(in[j]));
  }
  for (int64_t j = 0; j < tail; ++j) {
    if (j % threads / block == b) add(j % threads - first, 2, static_cast<acc_t>(body[vectors * kSize + j]));
  }
  for (int64_t t = 0; t < block; ++t) {
    values[t] = op(op(acc[t], acc[block + t]), op(acc[2 * block + t], acc[3 * block + t]));
  }
}

// One launch of device_reduce_kernel: the per-block results.
template <typename acc_t, typename scalar_t, typename Op>
std::vector<acc_t> device_reduce_blocks(const scalar_t* in, int64_t n, int64_t block, int64_t grid, Op op) {
  std::vector<acc_t> partials(grid), values(block), acc;
  for (int64_t b = 0; b < grid; ++b) {
    block_thread_results<acc_t>(in, n, b, block, grid, op, acc, values);
    partials[b] = block_reduce(values, op);
  }
  return partials;
}

// The grid device_reduce_grid picks on a GPU of this shape at full occupancy.
inline int64_t device_reduce_grid(int64_t n, int64_t element_bytes, int64_t block, const GpuShape& gpu) {
  const int64_t vectors = (n * element_bytes + 15) / 16;
  const int64_t wanted = (vectors + block * kUnroll - 1) / (block * kUnroll);
  return std::max<int64_t>(1, std::min(wanted, gpu.multiprocessors * (gpu.threads_per_multiprocessor / block)));
}

// The whole reduction: one block's result, or the partials folded by the last block (single_pass) or by a
// second one-block launch over the partials.
template <typename acc_t, typename scalar_t, typename Op>
acc_t device_reduce(const scalar_t* in, int64_t n, int64_t block, const GpuShape& gpu, bool single_pass, Op op) {
  const int64_t grid = device_reduce_grid(n, sizeof(scalar_t), block, gpu);
  std::vector<acc_t> partials = device_reduce_blocks<acc_t>(in, n, block, grid, op);
  if (grid == 1) return partials[0];
  if (!single_pass) return device_reduce_blocks<acc_t>(partials.data(), grid, block, 1, op)[0];
  std::vector<acc_t> values(block, Op::identity());
  for (int64_t tid = 0; tid < block; ++tid)
    for (int64_t b = tid; b < grid; b += block) values[tid] = op(values[tid], partials[b]);
  return block_reduce(values, op);
}

}  // namespace torch_reduce::cpu
