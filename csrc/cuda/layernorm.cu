// var_mean and LayerNorm on the GPU: rows of a contiguous (rows, cols) matrix.
//   row statistics: one warp per short row (<= 4 KiB), one block (128 or 512 threads) per long row; each
//     thread's share of the row is loaded with 16-byte vectors into registers (up to kItems vectors) and
//     reduced there in two passes (mean, then squared deviations), then the threads' (mean, m2, count) are
//     merged with Chan's combine through warp_reduce/block_reduce. Rows that do not fit, or are not 16-byte
//     aligned, stream through full_reduce.cuh's thread_reduce with the same Welford op and are read again to
//     normalize.
//   few long rows (var_mean over everything): each row split over blocks, a Welford partial per block,
//     folded by one block per row in a fixed order.
//   grad_weight/grad_bias: column sums in two stages, per-block partials over chunks of rows, then a fold
//     over the chunks in a fixed order: no float atomics, the same bits on every run.
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

constexpr int kItems = 8;                     // 16-byte vectors per thread kept in registers
constexpr unsigned kWarpRowsBlock = 128;      // warp-per-row kernels: four rows per block
// Block-per-row kernels: the smaller block while its threads hold the row, so each thread keeps several
// 16-byte loads in flight (one load per thread of a 512-thread block would leave the memory system idle).
constexpr unsigned kSmallRowBlock = 128, kRowBlock = 512;
constexpr int64_t kWarpRowBytes = 16 * kItems * kWarpSize;  // the longest row one warp holds: 4 KiB

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

// Which row kernel a (rows, cols) matrix gets.
enum class RowLayout { WarpRegisters, SmallBlockRegisters, BlockRegisters, WarpStreaming, BlockStreaming };

// aligned: every pointer the kernel reads or writes with vectors is 16-byte aligned.
template <typename scalar_t>
RowLayout row_layout(int64_t cols, bool aligned) {
  constexpr int64_t kSize = Vec16<scalar_t>::kSize;
  const bool short_row = cols * static_cast<int64_t>(sizeof(scalar_t)) <= kWarpRowBytes;
  if (aligned && cols % kSize == 0) {
    if (short_row) return RowLayout::WarpRegisters;
    if (cols / kSize <= static_cast<int64_t>(kItems) * kSmallRowBlock) return RowLayout::SmallBlockRegisters;
    if (cols / kSize <= static_cast<int64_t>(kItems) * kRowBlock) return RowLayout::BlockRegisters;
  }
  return short_row ? RowLayout::WarpStreaming : RowLayout::BlockStreaming;
}

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls launch(group, block, in_registers, grid): the first three compile-time constants, grid covering `rows`.
template <typename F>
void with_row_layout(RowLayout layout, int64_t rows, F&& launch) {
  using Warp = std::integral_constant<unsigned, kWarpSize>;
  using SmallBlock = std::integral_constant<unsigned, kSmallRowBlock>;
  using Block = std::integral_constant<unsigned, kRowBlock>;
  using WarpBlock = std::integral_constant<unsigned, kWarpRowsBlock>;
  const int64_t warp_grid = (rows + kWarpRowsBlock / kWarpSize - 1) / (kWarpRowsBlock / kWarpSize);
  TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(), "torch_reduce: too many rows for one launch: ", rows);
  switch (layout) {
    case RowLayout::WarpRegisters: return launch(Warp(), WarpBlock(), std::true_type(), warp_grid);
    case RowLayout::SmallBlockRegisters: return launch(SmallBlock(), SmallBlock(), std::true_type(), rows);
    case RowLayout::BlockRegisters: return launch(Block(), Block(), std::true_type(), rows);
    case RowLayout::WarpStreaming: return launch(Warp(), WarpBlock(), std::false_type(), warp_grid);
    default: return launch(Block(), Block(), std::false_type(), rows);
  }
}

// ------------------------------------------------------------------------------------------- var_mean ----

template <unsigned GROUP, unsigned BLOCK, bool kInRegisters, typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(BLOCK)
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
    with_row_layout(row_layout<scalar_t>(cols, aligned16(in)), rows, [&](auto group, auto block, auto in_registers,
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
__global__ void __launch_bounds__(BLOCK)
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
    with_row_layout(row_layout<scalar_t>(s.cols, aligned), s.rows, [&](auto group, auto block, auto in_registers,
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

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight, xhat = (x - mean) * rstd.
template <unsigned GROUP, unsigned BLOCK, bool kInRegisters, typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(BLOCK)
    layer_norm_bwd_input_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ in,
                                const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd,
                                const scalar_t* __restrict__ weight, scalar_t* __restrict__ grad_in, int64_t rows,
                                int64_t cols) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (BLOCK / GROUP) + threadIdx.x / GROUP;
  if (row >= rows) return;
  const unsigned t = threadIdx.x % GROUP;
  const scalar_t* x = in + row * cols;
  const scalar_t* dy = grad_out + row * cols;
  scalar_t* dx = grad_in + row * cols;
  const acc_t mu = mean[row], rs = rstd[row];
  acc_t sum_g = 0, sum_gx = 0;
  using V = Vec16<scalar_t>;
  const int64_t vectors = cols / V::kSize;
  // A 512-thread block leaves 128 registers a thread: too few to hold both x and dy (they spilled), so there
  // only x is held and dy is loaded where it is used (the second time an L2 hit: read a moment ago).
  constexpr bool kHoldGradOut = BLOCK != kRowBlock;
  RowRegisters<scalar_t> xr, dyr;
  const auto grad_out_vector = [&](int k, int64_t i) -> V {
    if constexpr (kHoldGradOut) {
      return dyr.v[k];
    } else {
      return load_vector(reinterpret_cast<const V*>(dy) + i);
    }
  };
  if constexpr (kInRegisters) {
    load_row<GROUP>(xr, x, vectors, t);
    if constexpr (kHoldGradOut) load_row<GROUP>(dyr, dy, vectors, t);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = t + static_cast<int64_t>(k) * GROUP;
      if (i >= vectors) continue;
      V wv;
      if (weight != nullptr) wv = load_vector(reinterpret_cast<const V*>(weight) + i);
      const V dyv = grad_out_vector(k, i);
#pragma unroll
      for (int e = 0; e < V::kSize; ++e) {
        acc_t g = static_cast<acc_t>(dyv.value[e]);
        if (weight != nullptr) g = mul_rounded(g, static_cast<acc_t>(wv.value[e]));
        sum_g += g;
        sum_gx += g * (static_cast<acc_t>(xr.v[k].value[e]) - mu) * rs;
      }
    }
  } else {
    for (int64_t j = t; j < cols; j += GROUP) {
      const acc_t g = mul_rounded(static_cast<acc_t>(dy[j]), weight != nullptr ? static_cast<acc_t>(weight[j]) : acc_t(1));
      sum_g += g;
      sum_gx += g * (static_cast<acc_t>(x[j]) - mu) * rs;
    }
  }
  const acc_t mean_g = group_allreduce<GROUP, BLOCK>(sum_g, SumOp<acc_t>()) / static_cast<acc_t>(cols);
  const acc_t mean_gx = group_allreduce<GROUP, BLOCK>(sum_gx, SumOp<acc_t>()) / static_cast<acc_t>(cols);
  if constexpr (kInRegisters) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = t + static_cast<int64_t>(k) * GROUP;
      if (i >= vectors) continue;
      V wv, o;
      if (weight != nullptr) wv = load_vector(reinterpret_cast<const V*>(weight) + i);
      const V dyv = grad_out_vector(k, i);
#pragma unroll
      for (int e = 0; e < V::kSize; ++e) {
        acc_t g = static_cast<acc_t>(dyv.value[e]);
        if (weight != nullptr) g = mul_rounded(g, static_cast<acc_t>(wv.value[e]));
        const acc_t xhat = (static_cast<acc_t>(xr.v[k].value[e]) - mu) * rs;
        o.value[e] = static_cast<scalar_t>(rs * (g - mean_g - xhat * mean_gx));
      }
      store_vector(reinterpret_cast<V*>(dx) + i, o);
    }
  } else {
    for (int64_t j = t; j < cols; j += GROUP) {
      const acc_t g = mul_rounded(static_cast<acc_t>(dy[j]), weight != nullptr ? static_cast<acc_t>(weight[j]) : acc_t(1));
      const acc_t xhat = (static_cast<acc_t>(x[j]) - mu) * rs;
      dx[j] = static_cast<scalar_t>(rs * (g - mean_g - xhat * mean_gx));
    }
  }
}

// Column sums, stage 1: block (tile, chunk) sums dy * xhat and dy over its chunk of rows for kColumnTile
// columns, kRowLanes rows at a time, then folds the kRowLanes lanes in order: one partial per column.
constexpr unsigned kColumnTile = 32, kRowLanes = 8, kColumnBlock = kColumnTile * kRowLanes;

template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kColumnBlock)
    layer_norm_bwd_params_partial_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ in,
                                         const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd, int64_t rows,
                                         int64_t cols, int64_t rows_per_chunk, acc_t* __restrict__ partial_weight,
                                         acc_t* __restrict__ partial_bias) {
  const unsigned lane = threadIdx.x % kColumnTile, row_lane = threadIdx.x / kColumnTile;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumnTile + lane;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = rows - begin < rows_per_chunk ? rows : begin + rows_per_chunk;
  acc_t dw = 0, db = 0;
  if (col < cols) {
#pragma unroll 4
    for (int64_t r = begin + row_lane; r < end; r += kRowLanes) {
      const acc_t d = static_cast<acc_t>(grad_out[r * cols + col]);
      dw += d * (static_cast<acc_t>(in[r * cols + col]) - mean[r]) * rstd[r];
      db += d;
    }
  }
  __shared__ acc_t lanes_w[kRowLanes][kColumnTile], lanes_b[kRowLanes][kColumnTile];
  lanes_w[row_lane][lane] = dw;
  lanes_b[row_lane][lane] = db;
  __syncthreads();
  if (row_lane == 0 && col < cols) {
    for (unsigned k = 1; k < kRowLanes; ++k) {
      dw += lanes_w[k][lane];
      db += lanes_b[k][lane];
    }
    partial_weight[blockIdx.y * cols + col] = dw;
    partial_bias[blockIdx.y * cols + col] = db;
  }
}

// Stage 2: one thread per column adds its chunks' partials, chunk 0 first.
template <typename scalar_t, typename acc_t>
__global__ void column_fold_kernel(const acc_t* __restrict__ partial_weight, const acc_t* __restrict__ partial_bias,
                                   int64_t chunks, int64_t cols, scalar_t* __restrict__ grad_weight,
                                   scalar_t* __restrict__ grad_bias) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  acc_t dw = 0, db = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    dw += partial_weight[c * cols + col];
    db += partial_bias[c * cols + col];
  }
  if (grad_weight != nullptr) grad_weight[col] = static_cast<scalar_t>(dw);
  if (grad_bias != nullptr) grad_bias[col] = static_cast<scalar_t>(db);
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
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "reduce::layer_norm_bwd", [&] {
    using acc_t = acc_type<scalar_t>;
    const scalar_t *xp = x.const_data_ptr<scalar_t>(), *dyp = dy.const_data_ptr<scalar_t>();
    const acc_t *mp = m.const_data_ptr<acc_t>(), *rp = rs.const_data_ptr<acc_t>();
    if (grad_input.numel() > 0) {
      const scalar_t* wp = data_or_null<scalar_t>(w);
      scalar_t* dxp = grad_input.mutable_data_ptr<scalar_t>();
      const bool aligned = aligned16(xp) && aligned16(dyp) && aligned16(wp) && aligned16(dxp);
      with_row_layout(row_layout<scalar_t>(cols, aligned), rows, [&](auto group, auto block, auto in_registers,
                                                                       int64_t grid) {
        layer_norm_bwd_input_kernel<decltype(group)::value, decltype(block)::value, decltype(in_registers)::value,
                                    scalar_t, acc_t>
            <<<grid, decltype(block)::value, 0, stream>>>(dyp, xp, mp, rp, wp, dxp, rows, cols);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    }
    if (grad_weight.numel() > 0 || grad_bias.numel() > 0) {
      // Enough (tile, chunk) blocks to fill the GPU at full occupancy; the split depends only on the shape
      // and the GPU, so the sums are the same bits on every run.
      const int64_t tiles = (cols + kColumnTile - 1) / kColumnTile;
      const int64_t chunks_wanted = std::clamp<int64_t>((8 * sms + tiles - 1) / tiles, 1, 65535);
      const int64_t rows_per_chunk = std::max<int64_t>(kRowLanes, (rows + chunks_wanted - 1) / chunks_wanted);
      const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
      TORCH_CHECK(tiles <= std::numeric_limits<int32_t>::max(), op, ": normalized size too large: ", cols);
      at::Tensor partials = at::empty({2, chunks, cols}, input.options().dtype(stat_type));
      acc_t* partial_weight = partials[0].mutable_data_ptr<acc_t>();
      acc_t* partial_bias = partials[1].mutable_data_ptr<acc_t>();
      layer_norm_bwd_params_partial_kernel<scalar_t, acc_t><<<dim3(tiles, chunks), kColumnBlock, 0, stream>>>(
          dyp, xp, mp, rp, rows, cols, rows_per_chunk, partial_weight, partial_bias);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      constexpr unsigned kFoldBlock = 256;
      column_fold_kernel<scalar_t, acc_t><<<(cols + kFoldBlock - 1) / kFoldBlock, kFoldBlock, 0, stream>>>(
          partial_weight, partial_bias, chunks, cols,
          grad_weight.numel() > 0 ? grad_weight.mutable_data_ptr<scalar_t>() : nullptr,
          grad_bias.numel() > 0 ? grad_bias.mutable_data_ptr<scalar_t>() : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
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
