#pragma once
// Device-wide reduction of a whole tensor at the memory-bandwidth limit (the ladder's sum_vec and
// sum_single_pass, and the full reductions of every dim reduction: torch_reduce.sum, prod, vector_norm, ...),
// driven by one ops object (common/reduce_ops.h) whose transform is applied as each element is loaded:
//   thread:  16-byte vector loads, kUnroll independent loads in flight, a grid-stride loop; the few
//            elements before the first 16-byte boundary (x[1:]) and after the last whole vector are
//            loaded one by one;
//   block:   block_reduce (warp shuffles);
//   device:  one partial per block, folded either by a second launch over the partials, or by the last
//            block to finish (a ticket taken with atomicAdd after __threadfence): one launch, and no
//            floating-point atomics, so the result does not depend on which block finishes last.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <type_traits>

#include "common/reduce_ops.h"
#include "cuda/block_reduce.cuh"
#include "cuda/launch.cuh"

namespace torch_reduce::cuda {

constexpr int kUnroll = kVectorUnroll;  // 16-byte loads in flight per thread and iteration (model_gpu.h)

template <typename scalar_t>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / sizeof(scalar_t);
  scalar_t value[kSize];
};

// A 16-byte load whatever the element type (one LDG.128), then the elements.
template <typename scalar_t>
__device__ __forceinline__ Vec16<scalar_t> load_vector(const Vec16<scalar_t>* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  Vec16<scalar_t> v;
  memcpy(&v, &raw, sizeof(v));
  return v;
}

// One vector's elements, loaded, folded pairwise (the same tree as the blocks, so the rounding error grows
// with log2 of its width, not its width).
template <typename acc_t, typename scalar_t, typename Ops>
__device__ __forceinline__ acc_t fold_vector(const Vec16<scalar_t>& v, Ops ops) {
  constexpr int kSize = Vec16<scalar_t>::kSize;
  if constexpr (sizeof(scalar_t) == 1 && std::is_same_v<Ops, SumOp<int64_t>>) {
    // Byte sums (int8, uint8, bool): __dp4a adds four bytes into an int32 in one instruction.
    const int* words = reinterpret_cast<const int*>(v.value);
    if constexpr (std::is_same_v<scalar_t, int8_t>) {
      int s = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) s = __dp4a(words[k], 0x01010101, s);
      return s;
    } else {
      unsigned s = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) s = __dp4a(static_cast<unsigned>(words[k]), 0x01010101u, s);
      return s;
    }
  } else {
    acc_t x[kSize];
#pragma unroll
    for (int k = 0; k < kSize; ++k) x[k] = load_element<acc_t>(ops, v.value[k]);
#pragma unroll
    for (int s = kSize / 2; s > 0; s /= 2) {
#pragma unroll
      for (int k = 0; k < s; ++k) x[k] = ops(x[k], x[k + s]);
    }
    return x[0];
  }
}

// A load from L2 (ld.global.cg): what another block wrote and published with __threadfence, never a
// stale L1 line. Accumulator structs are loaded word by word.
template <typename T>
__device__ __forceinline__ T load_from_l2(const T* p) {
  if constexpr (std::is_arithmetic_v<T>) {
    return __ldcg(p);
  } else {
    static_assert(sizeof(T) % 4 == 0, "accumulator structs are loaded as 4-byte words");
    T v;
    if constexpr (sizeof(T) % 16 == 0 && alignof(T) >= 16) {  // 16-byte runs (column_kernel's partials)
      for (unsigned k = 0; k < sizeof(T) / 16; ++k)
        reinterpret_cast<uint4*>(&v)[k] = __ldcg(reinterpret_cast<const uint4*>(p) + k);
    } else {
      for (unsigned k = 0; k < sizeof(T) / 4; ++k)
        reinterpret_cast<unsigned*>(&v)[k] = __ldcg(reinterpret_cast<const unsigned*>(p) + k);
    }
    return v;
  }
}

// Where the 16-byte-aligned body of a contiguous range starts and ends.
template <typename scalar_t>
struct AlignedSplit {
  int64_t head;     // scalars before the first 16-byte boundary
  int64_t vectors;  // whole vectors after it
  int64_t tail;     // scalars after the last whole vector
  __host__ __device__ AlignedSplit(const scalar_t* in, int64_t n) {
    constexpr int64_t kSize = Vec16<scalar_t>::kSize;
    const int64_t misaligned = (reinterpret_cast<uintptr_t>(in) % 16) / sizeof(scalar_t);
    head = misaligned == 0 ? 0 : (kSize - misaligned < n ? kSize - misaligned : n);
    vectors = (n - head) / kSize;
    tail = n - head - vectors * kSize;
  }
};

// How a thread reads its last, partial round of vectors (thread_reduce).
enum class LastRound {
  // One vector at a time, into accumulator 0: the whole-tensor kernel, whose threads stream many whole rounds
  // (one partial round is noise there), and whose order the CPU model replays (cpu/model.h).
  OneAtATime,
  // As a whole round, vector k into accumulator k, its loads issued together: an absent vector's load reads the
  // last vector instead (in bounds; a warp's such loads are one address) and its fold is dropped. For rows of a
  // few vectors a thread: one at a time, most threads of a row of 784 vectors (3136 floats, 256 threads) waited
  // for 3 loads one after another (H200, graph replay, against the run before: that row's sum 58.6 -> 50.0 us,
  // amax 82.1 -> 71.2). Every round is this one loop, the bounds tests included, since only rows take it (in the
  // whole-tensor kernel the tests cost 2-3% at 2^28 floats: 4431 -> 4332 GB/s); its loads are not predicated,
  // since a bfloat16 kernel then held every vector unpacked at once (55 registers, not 32).
  Together,
};

// Thread `thread` of `threads` folds its share of in[0, n): vectors thread, thread + threads, ..., in rounds of
// kUnroll, vector k of a round into accumulator k, a round's loads issued before any is used; the last, partial
// round as kLast says.
template <typename acc_t, LastRound kLast = LastRound::Together, typename scalar_t, typename Ops>
__device__ acc_t thread_reduce(const scalar_t* __restrict__ in, int64_t n, int64_t thread, int64_t threads, Ops ops) {
  using V = Vec16<scalar_t>;
  const AlignedSplit<scalar_t> split(in, n);
  const V* vin = reinterpret_cast<const V*>(in + split.head);

  acc_t acc[kUnroll];
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) acc[k] = Ops::identity();
  if constexpr (kLast == LastRound::OneAtATime) {
    int64_t i = thread;
    for (; i + (kUnroll - 1) * threads < split.vectors; i += kUnroll * threads) {
      V v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) v[k] = load_vector(vin + i + k * threads);
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) acc[k] = ops(acc[k], fold_vector<acc_t>(v[k], ops));
    }
    for (; i < split.vectors; i += threads) acc[0] = ops(acc[0], fold_vector<acc_t>(load_vector(vin + i), ops));
  } else {
    for (int64_t i = thread; i < split.vectors; i += kUnroll * threads) {
      V v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t j = i + k * threads;
        v[k] = load_vector(vin + (j < split.vectors ? j : split.vectors - 1));
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const acc_t folded = ops(acc[k], fold_vector<acc_t>(v[k], ops));
        if (i + k * threads < split.vectors) acc[k] = folded;
      }
    }
  }

  // Up to 15 scalars each side: one per thread for a block, a few per lane for a narrow row group.
  for (int64_t j = thread; j < split.head; j += threads) acc[1] = ops(acc[1], load_element<acc_t>(ops, in[j]));
  const scalar_t* tail = in + split.head + split.vectors * V::kSize;
  for (int64_t j = thread; j < split.tail; j += threads) acc[2] = ops(acc[2], load_element<acc_t>(ops, tail[j]));
  return ops(ops(acc[0], acc[1]), ops(acc[2], acc[3]));
}

// One block per share of the input. With `ticket` null, each block writes its partial and a second
// launch folds them; else the last block folds them and writes `out`. A grid of one block writes `out`.
template <unsigned BLOCK, typename scalar_t, typename acc_t, typename out_t, typename Ops>
__global__ void __launch_bounds__(BLOCK)
    device_reduce_kernel(const scalar_t* __restrict__ in, int64_t n, acc_t* __restrict__ partials,
                         unsigned* __restrict__ ticket, out_t* __restrict__ out, Ops ops) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * BLOCK + threadIdx.x;
  acc_t v = thread_reduce<acc_t, LastRound::OneAtATime>(in, n, thread, static_cast<int64_t>(gridDim.x) * BLOCK, ops);
  v = block_reduce<BLOCK>(v, ops);
  if (gridDim.x == 1) {
    if (threadIdx.x == 0) *out = static_cast<out_t>(project_result(ops, v));
    return;
  }
  if (ticket == nullptr) {
    if (threadIdx.x == 0) partials[blockIdx.x] = v;
    return;
  }
  __shared__ bool is_last_block;
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = v;
    __threadfence();  // publish the partial before the ticket says it is there
    is_last_block = atomicAdd(ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!is_last_block) return;
  acc_t w = Ops::identity();
  for (unsigned b = threadIdx.x; b < gridDim.x; b += BLOCK) w = ops(w, load_from_l2(partials + b));
  w = block_reduce<BLOCK>(w, ops);
  if (threadIdx.x == 0) {
    *out = static_cast<out_t>(project_result(ops, w));
    *ticket = 0;  // ready for the next launch that uses it
  }
}

// Blocks to launch: enough to cover the input once with kUnroll vectors per thread, capped at what the
// multiprocessors hold at once (a grid-stride loop covers the rest).
template <unsigned BLOCK, typename Kernel>
int64_t device_reduce_grid(Kernel kernel, int64_t vectors) {
  const int64_t resident = resident_blocks_per_sm(kernel, BLOCK) * multiprocessors();
  const int64_t wanted = (vectors + int64_t(BLOCK) * kUnroll - 1) / (int64_t(BLOCK) * kUnroll);
  return std::max<int64_t>(1, std::min<int64_t>(wanted, resident));
}

// Reduce n contiguous elements at `in` into out[0]. single_pass: last-block fold; else a second launch.
template <unsigned BLOCK, typename scalar_t, typename acc_t, typename out_t, typename Ops>
void launch_device_reduce(const scalar_t* in, int64_t n, out_t* out, Ops ops, bool single_pass) {
  const auto stream = at::cuda::getCurrentCUDAStream();
  auto first = device_reduce_kernel<BLOCK, scalar_t, acc_t, out_t, Ops>;
  const int64_t grid = device_reduce_grid<BLOCK>(first, (n + Vec16<scalar_t>::kSize - 1) / Vec16<scalar_t>::kSize);
  FoldScratch scratch;
  if (grid > 1) scratch = fold_scratch(grid * static_cast<int64_t>(sizeof(acc_t)), single_pass ? 1 : 0);
  acc_t* partial_ptr = static_cast<acc_t*>(scratch.partials);
  unsigned* ticket = scratch.tickets;
  first<<<grid, BLOCK, 0, stream>>>(in, n, partial_ptr, ticket, out, ops);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (grid > 1 && !single_pass) {
    using Fold = decltype(partials_ops(ops));  // the partials are transformed already
    device_reduce_kernel<BLOCK, acc_t, acc_t, out_t, Fold>
        <<<1, BLOCK, 0, stream>>>(partial_ptr, grid, nullptr, nullptr, out, partials_ops(ops));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// The same as the ladder calls it: a combine operator and no final map.
template <unsigned BLOCK, typename scalar_t, typename acc_t, typename out_t, typename Op>
void launch_device_reduce(const scalar_t* in, int64_t n, out_t* out, Op op, KeepValue, bool single_pass) {
  launch_device_reduce<BLOCK, scalar_t, acc_t>(in, n, out, op, single_pass);
}

}  // namespace torch_reduce::cuda
