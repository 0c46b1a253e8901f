// var_mean and LayerNorm on the GPU: rows of a contiguous (rows, cols) matrix.
//   row statistics: one warp per short row, one block of 64, 128, 256 or 512 threads per longer row (the
//     smallest that holds it); each thread's share of the row is loaded with 16-byte vectors into registers
//     (up to kItems vectors: 128 bytes a thread whatever the dtype, so bfloat16 rows keep as many bytes in
//     flight as float32 ones) and reduced there in two passes (mean, then squared deviations); the threads'
//     (mean, m2, count) are merged with Chan's combine through warp_reduce/block_reduce. Rows that do not
//     fit, or are not 16-byte aligned, stream through full_reduce.cuh's thread_reduce with the same Welford
//     op and are read again to normalize.
//   few long rows (var_mean over everything): each row split over blocks, a Welford partial per block,
//     folded by one block per row in a fixed order.
//   backward: one pass over x and dy gives grad_input and, in the same pass, the column sums behind
//     grad_weight/grad_bias: a resident grid of blocks walks the rows, each thread adds its own columns into
//     its group's accumulators in shared memory (global scratch when they do not fit), each block writes
//     one partial row, and a second kernel folds the partials in a fixed order: no float atomics, the same
//     bits on every run, and x and dy are read once.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/dispatch.h"
#include "common/reduce_ops.h"
#include "cuda/block_reduce.cuh"
#include "cuda/full_reduce.cuh"
#include "layernorm.h"

namespace torch_reduce::cuda {
namespace {

// 16-byte vectors a thread keeps in registers per row tensor: 128 bytes, whatever the dtype, so a
// bfloat16 row keeps as many bytes in flight per thread as a float32 one. 16-bit elements stay packed
// between passes (repack), so they cost the registers float32 elements do.
constexpr int kItems = 8;
constexpr unsigned kWarpRowsBlock = 128;  // warp-per-row kernels: four rows per block
// The smallest block per row. The backward's per-element work is longer (two column accumulators in shared
// memory), and its long per-thread chains ran slower in 64-thread blocks of 8 vectors than in 128-thread
// blocks of 4 (bfloat16 16384x4096 on the H200: 251 vs 201 us).
constexpr unsigned kMinRowBlock = 64, kMinBackwardRowBlock = 128;
constexpr unsigned kStreamingBlock = 512;
// Resident threads per SM the kernels are compiled for (the register budget): 1024 where a thread holds
// one row tensor, 512 where it holds two (the backward's x and dy).
constexpr unsigned kOneTensorThreads = 1024, kTwoTensorThreads = 512;

template <typename scalar_t>
__device__ __forceinline__ void store_vector(Vec16<scalar_t>* p, const Vec16<scalar_t>& v) {
  uint4 raw;
  memcpy(&raw, &v, sizeof(raw));
  *reinterpret_cast<uint4*>(p) = raw;
}

template <typename acc_t>
__device__ __forceinline__ acc_t reciprocal_sqrt(acc_t v) {
  if constexpr (std::is_same_v<acc_t, double>) {
    return ::rsqrt(v);
  } else {
    return ::rsqrtf(v);
  }
}

// The reduction of a GROUP-thread group (one warp, or the whole block), returned to every thread of it.
template <unsigned GROUP, unsigned BLOCK, typename T, typename Op>
__device__ __forceinline__ T group_allreduce(T v, Op op) {
  __shared__ T result[BLOCK / GROUP];
  const unsigned group = threadIdx.x / GROUP;
  if constexpr (GROUP == kWarpSize) {
    v = warp_reduce(v, op);
    if (threadIdx.x % kWarpSize == 0) result[group] = v;
    __syncwarp();
    v = result[group];
    __syncwarp();  // all lanes have read before the next call writes
  } else {
    static_assert(GROUP == BLOCK, "a group is one warp or the whole block");
    v = block_reduce<BLOCK>(v, op);
    if (threadIdx.x == 0) result[0] = v;
    __syncthreads();
    v = result[0];
    __syncthreads();  // all threads have read, and block_reduce's shared words are free again
  }
  return v;
}

// A thread's share of a row in registers: vectors t, t + GROUP, ..., at most kItems of them.
template <typename scalar_t>
struct RowRegisters {
  Vec16<scalar_t> v[kItems];
};

// Makes the compiler treat the packed words as new values, so a later pass converts 16-bit elements again
// (one instruction each) instead of keeping every converted float alive in between: twice the registers.
template <typename scalar_t>
__device__ __forceinline__ void repack(RowRegisters<scalar_t>& regs) {
  if constexpr (sizeof(scalar_t) == 2) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      auto* words = reinterpret_cast<uint32_t*>(regs.v[k].value);
#pragma unroll
      for (int w = 0; w < 4; ++w) asm volatile("" : "+r"(words[w]));
    }
  }
}

template <unsigned GROUP, typename scalar_t>
__device__ __forceinline__ void load_row(RowRegisters<scalar_t>& regs, const scalar_t* row, int64_t vectors,
                                         unsigned t) {
  const auto* vrow = reinterpret_cast<const Vec16<scalar_t>*>(row);
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t i = t + static_cast<int64_t>(k) * GROUP;
    if (i < vectors) regs.v[k] = load_vector(vrow + i);
  }
}

// A thread's statistics of its share of row[0, cols): from registers (loaded here, two passes), or
// streamed through thread_reduce with the Welford op.
template <unsigned GROUP, bool kInRegisters, typename acc_t, typename scalar_t>
__device__ __forceinline__ Welford<acc_t> thread_stats(const scalar_t* row, int64_t cols, unsigned t,
                                                       RowRegisters<scalar_t>& regs) {
  if constexpr (kInRegisters) {
    constexpr int kSize = Vec16<scalar_t>::kSize;
    const int64_t vectors = cols / kSize;
    load_row<GROUP>(regs, row, vectors, t);
    acc_t sum = 0;
    int count = 0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      if (t + static_cast<int64_t>(k) * GROUP < vectors) {
#pragma unroll
        for (int e = 0; e < kSize; ++e) sum += static_cast<acc_t>(regs.v[k].value[e]);
        count += kSize;
      }
    }
    if (count == 0) return WelfordOp<acc_t>::identity();
    repack(regs);
    const acc_t mean = sum / count;
    acc_t m2 = 0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      if (t + static_cast<int64_t>(k) * GROUP < vectors) {
#pragma unroll
        for (int e = 0; e < kSize; ++e) {
          const acc_t d = static_cast<acc_t>(regs.v[k].value[e]) - mean;
          m2 += d * d;
        }
      }
    }
    return Welford<acc_t>(mean, m2, static_cast<acc_t>(count));
  } else {
    return thread_reduce<Welford<acc_t>>(row, cols, t, GROUP, WelfordOp<acc_t>());
  }
}

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls launch(group, block, in_registers, grid) for a (rows, cols) matrix: the first three compile-time
// constants, grid covering the rows one group each. aligned: every pointer the kernel reads or writes with
// vectors is 16-byte aligned. MIN_BLOCK: the smallest block per row.
template <typename scalar_t, unsigned MIN_BLOCK, typename F>
void with_row_layout(int64_t rows, int64_t cols, bool aligned, F&& launch) {
  using Warp = std::integral_constant<unsigned, kWarpSize>;
  using WarpBlock = std::integral_constant<unsigned, kWarpRowsBlock>;
  using Streaming = std::integral_constant<unsigned, kStreamingBlock>;
  constexpr int64_t kSize = Vec16<scalar_t>::kSize, kWarpRowElements = int64_t{kWarpSize} * kItems * kSize;
  constexpr int64_t kMaxBlock = 512;
  TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(), "torch_reduce: too many rows for one launch: ", rows);
  const int64_t warp_grid = (rows + kWarpRowsBlock / kWarpSize - 1) / (kWarpRowsBlock / kWarpSize);
  const int64_t threads_needed = (cols / kSize + kItems - 1) / kItems;
  if (aligned && cols % kSize == 0 && threads_needed <= kMaxBlock) {
    if (cols <= kWarpRowElements) return launch(Warp(), WarpBlock(), std::true_type(), warp_grid);
    return with_power_of_two<MIN_BLOCK, kMaxBlock>(threads_needed, [&](auto block) {
      launch(block, block, std::true_type(), rows);
    });
  }
  if (cols <= kWarpRowElements) return launch(Warp(), WarpBlock(), std::false_type(), warp_grid);
  launch(Streaming(), Streaming(), std::false_type(), rows);
}

// ------------------------------------------------------------------------------------------- var_mean ----

template <unsigned GROUP, unsigned BLOCK, bool kInRegisters, typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(BLOCK, kOneTensorThreads / BLOCK)
    var_mean_rows_kernel(const scalar_t* __restrict__ in, int64_t rows, int64_t cols, acc_t divisor,
                         scalar_t* __restrict__ var, scalar_t* __restrict__ mean) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (BLOCK / GROUP) + threadIdx.x / GROUP;
  if (row >= rows) return;  // whole warps only: a block-wide group always has its row
  const unsigned t = threadIdx.x % GROUP;
  RowRegisters<scalar_t> regs;
  const Welford<acc_t> w = group_allreduce<GROUP, BLOCK>(
      thread_stats<GROUP, kInRegisters, acc_t>(in + row * cols, cols, t, regs), WelfordOp<acc_t>());
  if (t == 0) {
    var[row] = static_cast<scalar_t>(w.m2 / divisor);
    mean[row] = static_cast<scalar_t>(w.mean);
  }
}

// Few long rows: block (chunk, row) reduces row[chunk * chunk_len, ...) to one Welford partial.
template <unsigned BLOCK, typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(BLOCK)
    var_mean_chunks_kernel(const scalar_t* __restrict__ in, int64_t cols, int64_t chunk_len,
                           Welford<acc_t>* __restrict__ partials) {
  const int64_t row = blockIdx.y, begin = static_cast<int64_t>(blockIdx.x) * chunk_len;
  const int64_t n = cols - begin < chunk_len ? cols - begin : chunk_len;
  const WelfordOp<acc_t> op;
  Welford<acc_t> w = thread_reduce<Welford<acc_t>>(in + row * cols + begin, n, threadIdx.x, BLOCK, op);
  w = block_reduce<BLOCK>(w, op);
  if (threadIdx.x == 0) partials[row * gridDim.x + blockIdx.x] = w;
}

// One block per row folds that row's partials, always in the same order.
template <unsigned BLOCK, typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(BLOCK)
    var_mean_fold_kernel(const Welford<acc_t>* __restrict__ partials, int64_t chunks, acc_t divisor,
                         scalar_t* __restrict__ var, scalar_t* __restrict__ mean) {
  const int64_t row = blockIdx.x;
  const WelfordOp<acc_t> op;
  Welford<acc_t> w = WelfordOp<acc_t>::identity();
  for (int64_t c = threadIdx.x; c < chunks; c += BLOCK) w = op(w, partials[row * chunks + c]);
  w = block_reduce<BLOCK>(w, op);
  if (threadIdx.x == 0) {
    var[row] = static_cast<scalar_t>(w.m2 / divisor);
    mean[row] = static_cast<scalar_t>(w.mean);
  }
}

constexpr unsigned kChunkBlock = 512;
constexpr int64_t kMinChunk = 1 << 16;  // elements per block at least, so a block streams long enough

std::tuple<at::Tensor, at::Tensor> var_mean_cuda(const at::Tensor& input, at::OptionalIntArrayRef dim,
                                                 int64_t correction, bool keepdim) {
  const char* op = "reduce::var_mean";
  TORCH_CHECK(input.is_cuda(), op, ": expected a CUDA tensor, got one on ", input.device());
  const c10::cuda::CUDAGuard guard(input.device());
  VarMeanProblem p = var_mean_problem(input, dim, correction, keepdim, op);
  const int64_t rows = p.rows.size(0), cols = p.inner;
  if (rows == 0) return {p.var, p.mean};
  if (cols == 0) return {p.var.fill_(NAN), p.mean.fill_(NAN)};  // torch: the mean of nothing is NaN
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "reduce::var_mean", [&] {
    using acc_t = acc_type<scalar_t>;
    const scalar_t* in = p.rows.const_data_ptr<scalar_t>();
    scalar_t* var = p.var.mutable_data_ptr<scalar_t>();
    scalar_t* mean = p.mean.mutable_data_ptr<scalar_t>();
    const auto divisor = static_cast<acc_t>(p.divisor);
    if (rows < sms && cols >= 2 * kMinChunk) {
      // Too few rows to fill the GPU: split each over blocks.
      const int64_t chunks_wanted = (4 * sms + rows - 1) / rows;
      const int64_t chunk_len = std::max(kMinChunk, ((cols + chunks_wanted - 1) / chunks_wanted + 255) / 256 * 256);
      const int64_t chunks = (cols + chunk_len - 1) / chunk_len;
      at::Tensor partials = at::empty({rows * chunks * static_cast<int64_t>(sizeof(Welford<acc_t>))},
                                      input.options().dtype(at::kByte));
      auto* partial_ptr = reinterpret_cast<Welford<acc_t>*>(partials.mutable_data_ptr());
      var_mean_chunks_kernel<kChunkBlock, scalar_t, acc_t>
          <<<dim3(chunks, rows), kChunkBlock, 0, stream>>>(in, cols, chunk_len, partial_ptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      var_mean_fold_kernel<kChunkBlock, scalar_t, acc_t>
          <<<rows, kChunkBlock, 0, stream>>>(partial_ptr, chunks, divisor, var, mean);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
    with_row_layout<scalar_t, kMinRowBlock>(rows, cols, aligned16(in), [&](auto group, auto block, auto in_registers,
                                                                           int64_t grid) {
      var_mean_rows_kernel<decltype(group)::value, decltype(block)::value, decltype(in_registers)::value, scalar_t,
                           acc_t><<<grid, decltype(block)::value, 0, stream>>>(in, rows, cols, divisor, var, mean);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {p.var, p.mean};
}

// ------------------------------------------------------------------------------------ LayerNorm forward ----

template <unsigned GROUP, unsigned BLOCK, bool kInRegisters, typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(BLOCK, kOneTensorThreads / BLOCK)
    layer_norm_fwd_kernel(const scalar_t* __restrict__ in, const scalar_t* __restrict__ weight,
                          const scalar_t* __restrict__ bias, scalar_t* __restrict__ out, acc_t* __restrict__ mean_out,
                          acc_t* __restrict__ rstd_out, int64_t rows, int64_t cols, acc_t eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (BLOCK / GROUP) + threadIdx.x / GROUP;
  if (row >= rows) return;
  const unsigned t = threadIdx.x % GROUP;
  const scalar_t* x = in + row * cols;
  RowRegisters<scalar_t> regs;
  const Welford<acc_t> w = group_allreduce<GROUP, BLOCK>(thread_stats<GROUP, kInRegisters, acc_t>(x, cols, t, regs),
                                                         WelfordOp<acc_t>());
  const acc_t mean = w.mean, rstd = reciprocal_sqrt(w.m2 / static_cast<acc_t>(cols) + eps);
  repack(regs);
  if (t == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  scalar_t* y = out + row * cols;
  if constexpr (kInRegisters) {
    using V = Vec16<scalar_t>;
    const int64_t vectors = cols / V::kSize;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = t + static_cast<int64_t>(k) * GROUP;
      if (i >= vectors) continue;
      V wv, bv, o;
      if (weight != nullptr) wv = load_vector(reinterpret_cast<const V*>(weight) + i);
      if (bias != nullptr) bv = load_vector(reinterpret_cast<const V*>(bias) + i);
#pragma unroll
      for (int e = 0; e < V::kSize; ++e) {
        acc_t v = (static_cast<acc_t>(regs.v[k].value[e]) - mean) * rstd;
        if (weight != nullptr) v *= static_cast<acc_t>(wv.value[e]);
        if (bias != nullptr) v += static_cast<acc_t>(bv.value[e]);
        o.value[e] = static_cast<scalar_t>(v);
      }
      store_vector(reinterpret_cast<V*>(y) + i, o);
    }
  } else {
    for (int64_t j = t; j < cols; j += GROUP) {
      acc_t v = (static_cast<acc_t>(x[j]) - mean) * rstd;
      if (weight != nullptr) v *= static_cast<acc_t>(weight[j]);
      if (bias != nullptr) v += static_cast<acc_t>(bias[j]);
      y[j] = static_cast<scalar_t>(v);
    }
  }
}

at::Tensor optional_contiguous(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->contiguous() : at::Tensor();
}

template <typename scalar_t>
const scalar_t* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<scalar_t>() : nullptr;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd_cuda(const at::Tensor& input,
                                                                   c10::SymIntArrayRef normalized_shape,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   const std::optional<at::Tensor>& bias, double eps) {
  const char* op = "reduce::layer_norm_fwd";
  TORCH_CHECK(input.is_cuda(), op, ": expected a CUDA tensor, got one on ", input.device());
  const LayerNormShape s = layer_norm_shape(input, normalized_shape, weight, bias, op);
  check_eps(eps, op);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor x = input.contiguous(), w = optional_contiguous(weight), b = optional_contiguous(bias);
  at::Tensor out = at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
  const auto stat_options = input.options().dtype(stat_scalar_type(input.scalar_type()));
  at::Tensor mean = at::empty(s.stat_shape, stat_options), rstd = at::empty(s.stat_shape, stat_options);
  if (s.rows == 0 || s.cols == 0) return {out, mean.fill_(NAN), rstd.fill_(NAN)};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "reduce::layer_norm_fwd", [&] {
    using acc_t = acc_type<scalar_t>;
    const scalar_t *xp = x.const_data_ptr<scalar_t>(), *wp = data_or_null<scalar_t>(w), *bp = data_or_null<scalar_t>(b);
    scalar_t* yp = out.mutable_data_ptr<scalar_t>();
    const bool aligned = aligned16(xp) && aligned16(wp) && aligned16(bp) && aligned16(yp);
    with_row_layout<scalar_t, kMinRowBlock>(s.rows, s.cols, aligned, [&](auto group, auto block, auto in_registers,
                                                                         int64_t grid) {
      layer_norm_fwd_kernel<decltype(group)::value, decltype(block)::value, decltype(in_registers)::value, scalar_t,
                            acc_t><<<grid, decltype(block)::value, 0, stream>>>(
          xp, wp, bp, yp, mean.mutable_data_ptr<acc_t>(), rstd.mutable_data_ptr<acc_t>(), s.rows, s.cols,
          static_cast<acc_t>(eps));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {out, mean, rstd};
}

// ----------------------------------------------------------------------------------- LayerNorm backward ----

// g = dy * weight rounded on its own: an FMA fusing it into `g - mean_g` would keep the product's rounding
// error, which rstd then amplifies (a constant row, e.g. hidden = 1, must give exactly zero).
__device__ __forceinline__ float mul_rounded(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rounded(double a, double b) { return __dmul_rn(a, b); }

// Visits a thread's elements of one row: f(slot, dy, x, weight) on each, in acc_t (weight 1 when there is
// none), storing what f returns into out when out is given (16-byte stores from registers). slot is where
// the thread keeps that column's accumulators: element e of vector i at e * vectors + i, so the lanes of a
// warp touch consecutive words (no bank conflicts); column j itself when streaming.
template <unsigned GROUP, bool kInRegisters, typename acc_t, typename scalar_t, typename F>
__device__ __forceinline__ void visit_row(const RowRegisters<scalar_t>& xr, const RowRegisters<scalar_t>& dyr,
                                          const scalar_t* x, const scalar_t* dy, const scalar_t* weight,
                                          scalar_t* out, int64_t cols, unsigned t, F f) {
  if constexpr (kInRegisters) {
    using V = Vec16<scalar_t>;
    const int64_t vectors = cols / V::kSize;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = t + static_cast<int64_t>(k) * GROUP;
      if (i >= vectors) continue;
      V wv, o;
      if (weight != nullptr) wv = load_vector(reinterpret_cast<const V*>(weight) + i);
#pragma unroll
      for (int e = 0; e < V::kSize; ++e) {
        const acc_t w = weight != nullptr ? static_cast<acc_t>(wv.value[e]) : acc_t(1);
        o.value[e] = static_cast<scalar_t>(
            f(e * vectors + i, static_cast<acc_t>(dyr.v[k].value[e]), static_cast<acc_t>(xr.v[k].value[e]), w));
      }
      if (out != nullptr) store_vector(reinterpret_cast<V*>(out) + i, o);
    }
  } else {
    for (int64_t j = t; j < cols; j += GROUP) {
      const acc_t w = weight != nullptr ? static_cast<acc_t>(weight[j]) : acc_t(1);
      const acc_t r = f(j, static_cast<acc_t>(dy[j]), static_cast<acc_t>(x[j]), w);
      if (out != nullptr) out[j] = static_cast<scalar_t>(r);
    }
  }
}

// The accumulator slot of column c (see visit_row).
template <bool kInRegisters, typename scalar_t>
__device__ __forceinline__ int64_t column_slot(int64_t c, int64_t cols) {
  constexpr int kSize = Vec16<scalar_t>::kSize;
  return kInRegisters ? (c % kSize) * (cols / kSize) + c / kSize : c;
}

// One pass over x and dy per row:
//   grad_input = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * weight, xhat = (x - mean) * rstd;
//   grad_weight, grad_bias = column sums of dy * xhat and dy, added per group into `columns` (2 * cols
//   accumulators a group: dynamic shared memory, or global scratch when it is given), then folded over the
//   block's groups in order into the block's partial row: partials[blockIdx.x] (2 * cols: weight then bias).
// The grid is resident (a few blocks per SM) and walks the rows; grad_in or partials may be null.
template <unsigned GROUP, unsigned BLOCK, bool kInRegisters, typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(BLOCK, kTwoTensorThreads / BLOCK)
    layer_norm_bwd_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ in,
                          const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd,
                          const scalar_t* __restrict__ weight, scalar_t* __restrict__ grad_in, int64_t rows,
                          int64_t cols, acc_t* __restrict__ column_scratch, acc_t* __restrict__ partials) {
  constexpr unsigned kGroups = BLOCK / GROUP;
  extern __shared__ __align__(16) unsigned char shared_columns[];
  const unsigned group = threadIdx.x / GROUP, t = threadIdx.x % GROUP;
  const bool column_sums = partials != nullptr;
  acc_t* columns = column_scratch != nullptr ? column_scratch + blockIdx.x * (2 * kGroups * cols)
                                             : reinterpret_cast<acc_t*>(shared_columns);
  if (column_sums) {
    for (int64_t c = threadIdx.x; c < 2 * kGroups * cols; c += BLOCK) columns[c] = 0;
    __syncthreads();
  }
  acc_t* const weight_sums = columns + group * 2 * cols;
  acc_t* const bias_sums = weight_sums + cols;
  const acc_t inv_cols = acc_t(1) / static_cast<acc_t>(cols);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + group; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kGroups) {
    const scalar_t* x = in + row * cols;
    const scalar_t* dy = grad_out + row * cols;
    const acc_t mu = mean[row], rs = rstd[row];
    RowRegisters<scalar_t> xr, dyr;
    if constexpr (kInRegisters) {
      load_row<GROUP>(xr, x, cols / Vec16<scalar_t>::kSize, t);
      load_row<GROUP>(dyr, dy, cols / Vec16<scalar_t>::kSize, t);
    }
    SumPair<acc_t> sums = SumPairOp<acc_t>::identity();  // sum(g), sum(g * xhat)
    visit_row<GROUP, kInRegisters, acc_t>(xr, dyr, x, dy, weight, static_cast<scalar_t*>(nullptr), cols, t,
                                          [&](int64_t, acc_t d, acc_t xv, acc_t w) {
                                            const acc_t g = mul_rounded(d, w);
                                            sums.first += g;
                                            sums.second += g * ((xv - mu) * rs);
                                            return acc_t(0);
                                          });
    sums = group_allreduce<GROUP, BLOCK>(sums, SumPairOp<acc_t>());
    repack(xr);
    repack(dyr);
    const acc_t mean_g = sums.first * inv_cols, mean_gx = sums.second * inv_cols;
    visit_row<GROUP, kInRegisters, acc_t>(xr, dyr, x, dy, weight, grad_in == nullptr ? nullptr : grad_in + row * cols,
                                          cols, t, [&](int64_t slot, acc_t d, acc_t xv, acc_t w) {
                                            const acc_t xhat = (xv - mu) * rs;
                                            if (column_sums) {
                                              weight_sums[slot] += d * xhat;
                                              bias_sums[slot] += d;
                                              // Keeps the compiler from hoisting every element's
                                              // accumulator loads ahead (64 live values: spills).
                                              asm volatile("" ::: "memory");
                                            }
                                            return rs * (mul_rounded(d, w) - mean_g - xhat * mean_gx);
                                          });
  }
  if (column_sums) {
    __syncthreads();
    acc_t* const partial = partials + blockIdx.x * (2 * cols);
    for (int64_t c = threadIdx.x; c < 2 * cols; c += BLOCK) {
      const int64_t slot = (c < cols ? 0 : cols) + column_slot<kInRegisters, scalar_t>(c < cols ? c : c - cols, cols);
      acc_t s = 0;
      for (unsigned g = 0; g < kGroups; ++g) s += columns[g * 2 * cols + slot];
      partial[c] = s;
    }
  }
}

// grad_weight and grad_bias from the blocks' partial rows (chunks x 2 * cols): a tile of 32 columns per
// block, kFoldLanes lanes striding over the chunks, the lanes folded in order: the same bits every run.
constexpr unsigned kFoldTile = 32, kFoldLanes = 32;

template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kFoldTile * kFoldLanes)
    column_fold_kernel(const acc_t* __restrict__ partials, int64_t chunks, int64_t cols,
                       scalar_t* __restrict__ grad_weight, scalar_t* __restrict__ grad_bias) {
  const unsigned lane = threadIdx.x % kFoldTile, chunk_lane = threadIdx.x / kFoldTile;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kFoldTile + lane;  // of 2 * cols
  acc_t s = 0;
  if (c < 2 * cols) {
#pragma unroll 8
    for (int64_t k = chunk_lane; k < chunks; k += kFoldLanes) s += partials[k * 2 * cols + c];
  }
  __shared__ acc_t lanes[kFoldLanes][kFoldTile + 1];
  lanes[chunk_lane][lane] = s;
  __syncthreads();
  if (chunk_lane == 0 && c < 2 * cols) {
    for (unsigned k = 1; k < kFoldLanes; ++k) s += lanes[k][lane];
    scalar_t* out = c < cols ? grad_weight : grad_bias;
    if (out != nullptr) out[c < cols ? c : c - cols] = static_cast<scalar_t>(s);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd_cuda(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 3> output_mask) {
  const char* op = "reduce::layer_norm_bwd";
  TORCH_CHECK(input.is_cuda(), op, ": expected a CUDA tensor, got one on ", input.device());
  const LayerNormShape s = layer_norm_shape(input, normalized_shape, weight, bias, op);
  TORCH_CHECK(grad_out.sizes().equals(input.sizes()) && grad_out.scalar_type() == input.scalar_type() &&
                  grad_out.device() == input.device(), op, ": grad_out must have the input's shape, dtype and device");
  const auto stat_type = stat_scalar_type(input.scalar_type());
  TORCH_CHECK(mean.numel() == s.rows && rstd.numel() == s.rows && mean.scalar_type() == stat_type &&
                  rstd.scalar_type() == stat_type && mean.device() == input.device() &&
                  rstd.device() == input.device(),
              op, ": mean and rstd must be layer_norm_fwd's (", s.rows, " elements of ", stat_type, ")");
  const c10::cuda::CUDAGuard guard(input.device());
  const bool has_weight = weight.has_value() && weight->defined(), has_bias = bias.has_value() && bias->defined();
  const at::Tensor x = input.contiguous(), dy = grad_out.contiguous(), m = mean.contiguous(), rs = rstd.contiguous();
  const at::Tensor w = optional_contiguous(weight);
  const auto dense = input.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor grad_input = output_mask[0] ? at::empty(input.sizes(), dense) : not_requested(input);
  at::Tensor grad_weight = output_mask[1] && has_weight ? at::empty(weight->sizes(), dense) : not_requested(input);
  at::Tensor grad_bias = output_mask[2] && has_bias ? at::empty(bias->sizes(), dense) : not_requested(input);
  const int64_t rows = s.rows, cols = s.cols;
  if (cols == 0) return {grad_input, grad_weight, grad_bias};
  if (rows == 0) return {grad_input, grad_weight.zero_(), grad_bias.zero_()};
  const bool column_sums = grad_weight.numel() > 0 || grad_bias.numel() > 0;
  if (grad_input.numel() == 0 && !column_sums) return {grad_input, grad_weight, grad_bias};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "reduce::layer_norm_bwd", [&] {
    using acc_t = acc_type<scalar_t>;
    const scalar_t *xp = x.const_data_ptr<scalar_t>(), *dyp = dy.const_data_ptr<scalar_t>();
    const scalar_t* wp = data_or_null<scalar_t>(w);
    scalar_t* dxp = grad_input.numel() > 0 ? grad_input.mutable_data_ptr<scalar_t>() : nullptr;
    const bool aligned = aligned16(xp) && aligned16(dyp) && aligned16(wp) && aligned16(dxp);
    with_row_layout<scalar_t, kMinBackwardRowBlock>(rows, cols, aligned, [&](auto group, auto block, auto in_registers,
                                                                            int64_t row_grid) {
      constexpr unsigned kGroup = decltype(group)::value, kBlock = decltype(block)::value;
      const auto kernel = layer_norm_bwd_kernel<kGroup, kBlock, decltype(in_registers)::value, scalar_t, acc_t>;
      // The column accumulators live in shared memory when two blocks' worth fit on an SM.
      const int64_t column_bytes = column_sums ? 2 * (kBlock / kGroup) * cols * int64_t{sizeof(acc_t)} : 0;
      const bool in_shared = column_bytes <= static_cast<int64_t>(props->sharedMemPerBlockOptin / 2);
      const size_t shared_bytes = in_shared ? static_cast<size_t>(column_bytes) : 0;
      if (shared_bytes > props->sharedMemPerBlock) {
        C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared_bytes)));
      }
      int resident = 0;
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kBlock, shared_bytes));
      // Resident blocks only, so each block's partial covers many rows; the grid depends on the shape and
      // the GPU alone, so the column sums are the same bits on every run.
      const int64_t grid = std::min<int64_t>(row_grid, std::max(resident, 1) * int64_t{props->multiProcessorCount});
      at::Tensor partials, scratch;
      const auto stat_options = input.options().dtype(stat_type);
      if (column_sums) {
        partials = at::empty({grid, 2 * cols}, stat_options);
        if (!in_shared) scratch = at::empty({grid, column_bytes / int64_t{sizeof(acc_t)}}, stat_options);
      }
      kernel<<<grid, kBlock, shared_bytes, stream>>>(
          dyp, xp, m.const_data_ptr<acc_t>(), rs.const_data_ptr<acc_t>(), wp, dxp, rows, cols,
          scratch.defined() ? scratch.mutable_data_ptr<acc_t>() : nullptr,
          partials.defined() ? partials.mutable_data_ptr<acc_t>() : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      if (column_sums) {
        const int64_t tiles = (2 * cols + kFoldTile - 1) / kFoldTile;
        TORCH_CHECK(tiles <= std::numeric_limits<int32_t>::max(), op, ": normalized size too large: ", cols);
        column_fold_kernel<scalar_t, acc_t><<<tiles, kFoldTile * kFoldLanes, 0, stream>>>(
            partials.const_data_ptr<acc_t>(), grid, cols,
            grad_weight.numel() > 0 ? grad_weight.mutable_data_ptr<scalar_t>() : nullptr,
            grad_bias.numel() > 0 ? grad_bias.mutable_data_ptr<scalar_t>() : nullptr);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    });
  });
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CUDA, m) {
  m.impl("var_mean", &var_mean_cuda);
  m.impl("layer_norm_fwd", &layer_norm_fwd_cuda);
  m.impl("layer_norm_bwd", &layer_norm_bwd_cuda);
}

}  // namespace torch_reduce::cuda
