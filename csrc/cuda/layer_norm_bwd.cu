// LayerNorm and RMSNorm backward on the GPU (one kernel, RowNorm says which), one pass over x and dy:
//   LayerNorm: grad_input = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * weight, xhat = (x - mean) * rstd;
//   RMSNorm:   grad_input = rstd * (g - xhat * mean(g * xhat)),            xhat = x * rstd;
//   grad_weight (and LayerNorm's grad_bias) = column sums of dy * xhat (and dy), without float atomics: a
//   resident grid of blocks walks the rows, each block sums its rows' columns into one partial row, and
//   column_fold_kernel folds the partials in a fixed order (the same bits on every run). x and dy are read
//   once: 3 x N elements of traffic (torch reads them twice, once for grad_input and once for the column sums).
//   A fused add + norm's backward passes grad_sum, the gradient of the sum's other uses, which is added to
//   grad_input as it is stored.
// Row kernel (16-byte aligned rows): thread t of a row's group owns the same columns in every row it visits
// (row_layout.cuh), so its column sums stay in registers, two accumulators an element, from the first row to
// the last. Where a row's x and dy are between the two passes (RowSource):
//   Held:   in registers (16-bit ones packed), for rows of up to Tuning::kHeldItems vectors a thread;
//   Reread: wider rows (up to Tuning::kRereadItems vectors a thread): read again in the second pass, from L2
//           (the block's row was just read), so that the registers hold the accumulators alone.
// Measured on the H200 and kept out (bfloat16 runs at 35-75% of the line; none of these moved it):
// - the next row staged in shared memory with cp.async while this one is computed (two stages): float32
//   65536x4096 65% of the line against 82%; bfloat16 no faster;
// - bulk copies (TMA) of x and dy into shared memory 2-4 rows ahead per block, column sums in registers:
//   bfloat16 0.52-1.03x the Held kernel (16384x4096: 185 vs 147 us), float32 0.64-1.00x;
// - the next row's x and dy loaded into registers during this one, by loads the compiler may not move or
//   repeat (ld.global volatile, issued before the row's barrier; SASS checked), two vectors a thread: within
//   2% at 13 shapes, LayerNorm and RMSNorm; one vector a thread at 1024 threads per SM: 0.59-1.09x;
// - bfloat16 unpacked by shift and mask (11% fewer instructions, ptxas): 0-3% slower.
// So neither loads in flight nor the instruction count is what holds it. Nsight Compute, bfloat16 16384x4096:
// 121 registers, 4 warps per scheduler (1.2 eligible), an instruction issued in 57% of cycles, DRAM 50% busy,
// the top stall (30%) a wait on L1TEX (weight and statistics loads, shared memory).
// Streaming kernel (rows that are not 16-byte aligned, or wider): element by element, the column sums in
// shared memory, or in global scratch when two blocks' worth do not fit an SM.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/dispatch.h"
#include "cuda/arch_check.cuh"
#include "common/reduce_ops.h"
#include "cuda/launch.cuh"
#include "cuda/row_layout.cuh"
#include "cuda/tuning.h"
#include "layernorm.h"
#include "norm_ops.h"

namespace torch_reduce::cuda {
namespace {

enum class RowSource { Held, Reread };


// g = dy * weight rounded on its own: an FMA fusing it into `g - mean_g` would keep the product's rounding
// error, which rstd then amplifies (a constant row, e.g. hidden = 1, must give exactly zero).
__device__ __forceinline__ float mul_rounded(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rounded(double a, double b) { return __dmul_rn(a, b); }

// A 16-byte load the compiler may not merge with an earlier load of the same address: the Reread kernel's
// second pass reads x and dy again instead of keeping the first pass's values alive.
template <typename scalar_t>
__device__ __forceinline__ Vec16<scalar_t> load_vector_again(const Vec16<scalar_t>* p) {
  uint4 raw;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
               : "l"(p));
  Vec16<scalar_t> v;
  memcpy(&v, &raw, sizeof(v));
  return v;
}

// The block's partial row from its groups' column sums (`columns`: [group][weight | bias][cols], in shared
// memory or global scratch; `slots` = param_sums * cols a group), added in group order: the same bits on every run.
template <unsigned BLOCK, unsigned kGroups, typename acc_t>
__device__ __forceinline__ void fold_groups(const acc_t* columns, int64_t slots, acc_t* __restrict__ partial) {
  for (int64_t c = threadIdx.x; c < slots; c += BLOCK) {
    acc_t sum = 0;
    for (unsigned g = 0; g < kGroups; ++g) sum += columns[g * slots + c];
    partial[c] = sum;
  }
}

// kGradSum: grad_sum is given (a fused add + norm's backward). A template flag, so the ordinary kernels keep
// their registers: the load and add spilled the wide-row kernels of 512 threads (ptxas: 88 bytes).
template <typename Tuning, RowNorm kNorm, unsigned GROUP, unsigned BLOCK, int ITEMS, RowSource kSource,
          bool kGradSum, typename scalar_t, typename param_t, typename acc_t>
__global__ void __launch_bounds__(BLOCK, Tuning::kBackwardThreads / BLOCK)
    row_norm_bwd_rows_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ in,
                               const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd,
                               const param_t* __restrict__ weight, const scalar_t* __restrict__ grad_sum,
                               scalar_t* __restrict__ grad_in, int64_t rows, int64_t cols,
                               acc_t* __restrict__ partials) {
  using V = Vec16<scalar_t>;
  constexpr int kSize = V::kSize;
  constexpr unsigned kGroups = BLOCK / GROUP;
  constexpr bool kLayer = kNorm == RowNorm::Layer;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const unsigned group = threadIdx.x / GROUP, t = threadIdx.x % GROUP;
  const int64_t vectors = cols / kSize, slots = param_sums(kNorm) * cols;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kGroups;
  const acc_t inv_cols = acc_t(1) / static_cast<acc_t>(cols);
  constexpr bool kHeld = kSource == RowSource::Held;
  // Vector k (column vector i) of tensor j (0: x, 1: dy) of the current row; again: the second pass.
  RowRegisters<scalar_t, kHeld ? ITEMS : 1> xr, dyr;
  const auto row_vector = [&](int j, int64_t row, int k, int64_t i, bool again) {
    if constexpr (kHeld) {
      return j == 0 ? xr.v[k] : dyr.v[k];
    } else {
      const auto* p = reinterpret_cast<const V*>((j == 0 ? in : grad_out) + row * cols) + i;
      return again ? load_vector_again(p) : load_vector(p);
    }
  };

  acc_t dw[ITEMS][kSize], db[ITEMS][kSize];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
    for (int e = 0; e < kSize; ++e) dw[k][e] = db[k][e] = 0;
  }
  GroupAllreduce<GROUP, BLOCK, SumPair<acc_t>> allreduce;
  // The group's rows; whole groups iterate together, so every thread reaches the group's reductions.
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + group; row < rows; row += step) {
    if constexpr (kHeld) {
      load_row<GROUP>(xr, in + row * cols, vectors, t);
      load_row<GROUP>(dyr, grad_out + row * cols, vectors, t);
    }
    const acc_t mu = kLayer ? mean[row] : acc_t(0), rs = rstd[row];
    // f(k, i, x, dy, weight) on each of the thread's vectors of the row (weight 1 without one).
    const auto visit_row = [&](bool again, auto f) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t i = t + static_cast<int64_t>(k) * GROUP;
        if (i >= vectors) continue;
        acc_t wv[kSize];
        if (weight != nullptr) {
          load_params(weight, i * kSize, wv);
        } else {
#pragma unroll
          for (int e = 0; e < kSize; ++e) wv[e] = 1;
        }
        f(k, i, row_vector(0, row, k, i, again), row_vector(1, row, k, i, again), wv);
      }
    };
    SumPair<acc_t> sums = SumPairOp<acc_t>::identity();  // sum(g) (LayerNorm), sum(g * xhat)
    visit_row(false, [&](int, int64_t, const V& xv, const V& dv, const acc_t(&wv)[kSize]) {
#pragma unroll
      for (int e = 0; e < kSize; ++e) {
        const acc_t d = static_cast<acc_t>(dv.value[e]);
        const acc_t g = weight != nullptr ? mul_rounded(d, wv[e]) : d;
        if (kLayer) sums.first += g;
        sums.second += g * ((static_cast<acc_t>(xv.value[e]) - mu) * rs);
      }
    });
    sums = allreduce(sums, SumPairOp<acc_t>());
    if constexpr (kHeld) {
      repack(xr);
      repack(dyr);
    }
    const acc_t mean_g = kLayer ? sums.first * inv_cols : acc_t(0), mean_gx = sums.second * inv_cols;
    visit_row(true, [&](int k, int64_t i, const V& xv, const V& dv, const acc_t(&wv)[kSize]) {
      V o, gs = {};
      if (kGradSum && grad_in != nullptr) {
        gs = load_vector(reinterpret_cast<const V*>(grad_sum + row * cols) + i);
      }
#pragma unroll
      for (int e = 0; e < kSize; ++e) {
        const acc_t d = static_cast<acc_t>(dv.value[e]), xhat = (static_cast<acc_t>(xv.value[e]) - mu) * rs;
        const acc_t g = weight != nullptr ? mul_rounded(d, wv[e]) : d;
        dw[k][e] += d * xhat;
        if (kLayer) db[k][e] += d;
        o.value[e] = static_cast<scalar_t>(rs * (g - mean_g - xhat * mean_gx) + static_cast<acc_t>(gs.value[e]));
      }
      if (grad_in != nullptr) store_vector(reinterpret_cast<V*>(grad_in + row * cols) + i, o);
    });
  }
  if (partials == nullptr) return;
  // The block's partial row: weight sums, then bias sums, each element-major (element e of vector i at
  // e * vectors + i), so that a warp's stores of one element fill whole sectors; column_fold_kernel maps
  // them back. (Column order, a thread's 8 or 4 consecutive floats, cost 8 or 4 partial-sector stores an
  // element: H200, bfloat16 1024x2560, graph replay: 35.0 us for the backward then, 13.3 us now.) Several
  // groups (warp rows) meet in shared memory first, without bank conflicts in this order.
  acc_t* const partial = partials + blockIdx.x * slots;
  acc_t* const columns = kGroups == 1 ? partial : reinterpret_cast<acc_t*>(shared_bytes) + group * slots;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t i = t + static_cast<int64_t>(k) * GROUP;
    if (i >= vectors) continue;
#pragma unroll
    for (int e = 0; e < kSize; ++e) {
      columns[e * vectors + i] = dw[k][e];
      if (kLayer) columns[cols + e * vectors + i] = db[k][e];
    }
  }
  if constexpr (kGroups > 1) {
    __syncthreads();
    fold_groups<BLOCK, kGroups>(reinterpret_cast<const acc_t*>(shared_bytes), slots, partial);
  }
}

// The streaming kernel: as above, element by element, each thread adding its columns' dy * xhat and dy into
// its group's param_sums * cols accumulators (`columns`: dynamic shared memory, or global scratch when given),
// folded over the block's groups in order into the block's partial row at the end.
template <RowNorm kNorm, unsigned GROUP, unsigned BLOCK, bool kGradSum, typename scalar_t, typename param_t,
          typename acc_t>
__global__ void __launch_bounds__(BLOCK)
    row_norm_bwd_streaming_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ in,
                                    const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd,
                                    const param_t* __restrict__ weight, const scalar_t* __restrict__ grad_sum,
                                    scalar_t* __restrict__ grad_in, int64_t rows, int64_t cols,
                                    acc_t* __restrict__ column_scratch, acc_t* __restrict__ partials) {
  constexpr unsigned kGroups = BLOCK / GROUP;
  constexpr bool kLayer = kNorm == RowNorm::Layer;
  extern __shared__ __align__(16) unsigned char shared_columns[];
  const unsigned group = threadIdx.x / GROUP, t = threadIdx.x % GROUP;
  const bool column_sums = partials != nullptr;
  const int64_t slots = param_sums(kNorm) * cols;
  acc_t* columns = column_scratch != nullptr ? column_scratch + blockIdx.x * (kGroups * slots)
                                             : reinterpret_cast<acc_t*>(shared_columns);
  if (column_sums) {
    for (int64_t c = threadIdx.x; c < kGroups * slots; c += BLOCK) columns[c] = 0;
    __syncthreads();
  }
  acc_t* const weight_sums = columns + group * slots;
  acc_t* const bias_sums = weight_sums + cols;
  const acc_t inv_cols = acc_t(1) / static_cast<acc_t>(cols);
  GroupAllreduce<GROUP, BLOCK, SumPair<acc_t>> allreduce;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + group; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kGroups) {
    const scalar_t* x = in + row * cols;
    const scalar_t* dy = grad_out + row * cols;
    const acc_t mu = kLayer ? mean[row] : acc_t(0), rs = rstd[row];
    SumPair<acc_t> sums = SumPairOp<acc_t>::identity();
    for (int64_t j = t; j < cols; j += GROUP) {
      const acc_t d = static_cast<acc_t>(dy[j]);
      const acc_t g = weight != nullptr ? mul_rounded(d, static_cast<acc_t>(weight[j])) : d;
      if (kLayer) sums.first += g;
      sums.second += g * ((static_cast<acc_t>(x[j]) - mu) * rs);
    }
    sums = allreduce(sums, SumPairOp<acc_t>());
    const acc_t mean_g = kLayer ? sums.first * inv_cols : acc_t(0), mean_gx = sums.second * inv_cols;
    for (int64_t j = t; j < cols; j += GROUP) {
      const acc_t d = static_cast<acc_t>(dy[j]), xhat = (static_cast<acc_t>(x[j]) - mu) * rs;
      const acc_t g = weight != nullptr ? mul_rounded(d, static_cast<acc_t>(weight[j])) : d;
      if (column_sums) {
        weight_sums[j] += d * xhat;
        if (kLayer) bias_sums[j] += d;
      }
      if (grad_in != nullptr) {
        const acc_t extra = kGradSum ? static_cast<acc_t>(grad_sum[row * cols + j]) : acc_t(0);
        grad_in[row * cols + j] = static_cast<scalar_t>(rs * (g - mean_g - xhat * mean_gx) + extra);
      }
    }
  }
  if (column_sums) {
    __syncthreads();
    fold_groups<BLOCK, kGroups>(columns, slots, partials + blockIdx.x * slots);
  }
}

// grad_weight and grad_bias from the blocks' partial rows (chunks x slots: weight's cols, then bias's where
// slots == 2 * cols, each element-major over `vectors` vectors a row: vectors == cols for the streaming
// kernel's column order): a tile of kFoldTile slots
// per block, kFoldLanes lanes striding over the chunks, the lanes folded in order: the same bits every run.
template <typename Tuning, typename param_t, typename acc_t>
__global__ void __launch_bounds__(Tuning::kFoldTile * Tuning::kFoldLanes)
    column_fold_kernel(const acc_t* __restrict__ partials, int64_t chunks, int64_t slots, int64_t cols, int64_t vectors,
                       param_t* __restrict__ grad_weight, param_t* __restrict__ grad_bias) {
  constexpr unsigned kFoldTile = Tuning::kFoldTile, kFoldLanes = Tuning::kFoldLanes;
  const unsigned lane = threadIdx.x % kFoldTile, chunk_lane = threadIdx.x / kFoldTile;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kFoldTile + lane;  // slot of a partial row
  acc_t s = 0;
  if (c < slots) {
#pragma unroll 8
    for (int64_t k = chunk_lane; k < chunks; k += kFoldLanes) s += partials[k * slots + c];
  }
  __shared__ acc_t lanes[kFoldLanes][kFoldTile + 1];
  lanes[chunk_lane][lane] = s;
  __syncthreads();
  if (chunk_lane == 0 && c < slots) {
    for (unsigned k = 1; k < kFoldLanes; ++k) s += lanes[k][lane];
    param_t* out = c < cols ? grad_weight : grad_bias;
    const int64_t slot = c < cols ? c : c - cols, column = slot % vectors * (cols / vectors) + slot / vectors;
    if (out != nullptr) out[column] = static_cast<param_t>(s);
  }
}

// The backward of either norm; `mean` is undefined for RMSNorm, and so is `bias`; grad_sum may be undefined.
template <RowNorm kNorm>
std::tuple<at::Tensor, at::Tensor, at::Tensor> row_norm_bwd(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 3> output_mask, const at::Tensor& grad_sum) {
  constexpr const char* op = kBackwardName<kNorm>;
  TORCH_CHECK(input.is_cuda(), op, ": expected every tensor on one CUDA device, got the input on ", input.device());
  const LayerNormShape s = layer_norm_shape(input, normalized_shape, weight, bias, op);
  check_norm_bwd(grad_out, input, mean, rstd, s, op);
  check_grad_sum(grad_sum, input, op);
  const c10::cuda::CUDAGuard guard(input.device());
  check_kernel_image_for_current_device();
  const at::Tensor x = input.contiguous(), dy = grad_out.contiguous(), rs = rstd.contiguous();
  const at::Tensor m = mean.defined() ? mean.contiguous() : at::Tensor();
  const at::Tensor gsum = grad_sum.defined() ? grad_sum.contiguous() : at::Tensor();
  const at::Tensor w = defined(weight) ? weight->contiguous() : at::Tensor();
  auto [grad_input, grad_weight, grad_bias] = layer_norm_grads(input, weight, bias, output_mask, s);
  const int64_t rows = s.rows, cols = s.cols;
  if (cols == 0) return {grad_input, grad_weight, grad_bias};
  if (rows == 0) return {grad_input, grad_weight.zero_(), grad_bias.zero_()};
  const bool column_sums = grad_weight.numel() > 0 || grad_bias.numel() > 0;
  if (grad_input.numel() == 0 && !column_sums) return {grad_input, grad_weight, grad_bias};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t sms = multiprocessors();
  const auto stat_options = input.options().dtype(stat_scalar_type(input.scalar_type()));
  const int64_t slots = param_sums(kNorm) * cols;  // a partial row's column sums
  TORCH_REDUCE_DISPATCH_FLOATING(input.scalar_type(), op, [&] {
    with_tuning([&](auto tuning) {
      using Tuning = decltype(tuning);
      // The tuning's numbers are read as Tuning::k... in the lambdas below: local constexpr copies inside this
      // function template's nested generic lambdas are not constant expressions to g++ in C++17.
      with_param_type<scalar_t>(s.param_type, [&](auto param) {
        using param_t = decltype(param);
        using acc_t = acc_type<scalar_t>;
        const scalar_t *xp = x.const_data_ptr<scalar_t>(), *dyp = dy.const_data_ptr<scalar_t>();
        const param_t* wp = w.defined() ? w.const_data_ptr<param_t>() : nullptr;
        scalar_t* dxp = grad_input.numel() > 0 ? grad_input.mutable_data_ptr<scalar_t>() : nullptr;
        const acc_t *mp = m.defined() ? m.const_data_ptr<acc_t>() : nullptr, *rp = rs.const_data_ptr<acc_t>();
        const scalar_t* gsp = gsum.defined() ? gsum.const_data_ptr<scalar_t>() : nullptr;
        const bool aligned = aligned16(xp) && aligned16(dyp) && aligned16(wp) && aligned16(dxp) && aligned16(gsp);
        // A resident grid, so each block's partial covers many rows; it depends on the shape and the GPU alone,
        // so the column sums are the same bits on every run.
        at::Tensor partials;
        int64_t grid = 0, partial_vectors = cols;  // the partial rows' layout (see column_fold_kernel)
        const auto partial_rows = [&](int64_t row_grid, int64_t resident) {
          grid = std::min(row_grid, resident);
          if (column_sums) partials = at::empty({grid, slots}, stat_options);
          return column_sums ? partials.mutable_data_ptr<acc_t>() : nullptr;
        };
        // f(std::bool_constant<grad_sum given>()).
        const auto with_grad_sum = [&](auto f) { return gsp != nullptr ? f(std::true_type()) : f(std::false_type()); };
        const auto launch_rows = [&](auto group, auto block, auto items, auto source, int64_t row_grid) {
          with_grad_sum([&](auto grad_sum_given) {
            constexpr unsigned kGroup = decltype(group)::value, kBlock = decltype(block)::value;
            const auto kernel =
                row_norm_bwd_rows_kernel<Tuning, kNorm, kGroup, kBlock, decltype(items)::value, decltype(source)::value,
                                         decltype(grad_sum_given)::value, scalar_t, param_t, acc_t>;
            // Warp rows meet in shared memory at the end: four groups' columns (at most 24 KiB).
            const size_t shared_bytes = kBlock == kGroup ? 0 : (kBlock / kGroup) * slots * sizeof(acc_t);
            acc_t* partial_ptr = partial_rows(row_grid, resident_blocks_per_sm(kernel, kBlock, shared_bytes) * sms);
            partial_vectors = cols / Vec16<scalar_t>::kSize;
            kernel<<<grid, kBlock, shared_bytes, stream>>>(dyp, xp, mp, rp, wp, gsp, dxp, rows, cols, partial_ptr);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          });
        };
        using Held = std::integral_constant<RowSource, RowSource::Held>;
        using Reread = std::integral_constant<RowSource, RowSource::Reread>;
        constexpr int64_t kSize = Vec16<scalar_t>::kSize;
        const int64_t vectors = cols / kSize;
        bool launched = false;
        if (aligned && cols % kSize == 0) {
          using Items = std::integral_constant<int, Tuning::template kHeldItems<scalar_t>>;
          if (vectors <= int64_t{Tuning::kMaxRowBlock} * Items::value) {
            with_row_layout<Tuning, scalar_t, Items::value, Tuning::kMinBackwardBlock>(
                rows, cols, true, sms * Tuning::kBackwardThreads, [&](auto group, auto block, auto, int64_t row_grid) {
                  launch_rows(group, block, Items(), Held(), row_grid);
                });
            launched = true;
          }
          if constexpr (Tuning::template kRereadItems<scalar_t> > 0) {
            using Block = std::integral_constant<unsigned, Tuning::kMaxRowBlock>;
            using Wide = std::integral_constant<int, Tuning::template kRereadItems<scalar_t>>;
            if (!launched && vectors <= int64_t{Tuning::kMaxRowBlock} * Wide::value) {
              TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(), op, ": too many rows for one launch: ", rows);
              launch_rows(Block(), Block(), Wide(), Reread(), rows);
              launched = true;
            }
          }
        }
        if (!launched) {
          const int64_t warp_rows = int64_t{kWarpSize} * Tuning::template kHeldItems<scalar_t> * kSize;
          const auto launch = [&](auto group, auto block, int64_t row_grid) {
            with_grad_sum([&](auto grad_sum_given) {
              constexpr unsigned kGroup = decltype(group)::value, kBlock = decltype(block)::value;
              const auto kernel = row_norm_bwd_streaming_kernel<kNorm, kGroup, kBlock, decltype(grad_sum_given)::value,
                                                                scalar_t, param_t, acc_t>;
              // The column accumulators live in shared memory when two blocks' worth fit on an SM.
              const int64_t column_bytes = column_sums ? (kBlock / kGroup) * slots * int64_t{sizeof(acc_t)} : 0;
              const bool in_shared = column_bytes <= static_cast<int64_t>(allow_max_dynamic_shared(kernel) / 2);
              const size_t shared_bytes = in_shared ? static_cast<size_t>(column_bytes) : 0;
              acc_t* partial_ptr = partial_rows(row_grid, resident_blocks_per_sm(kernel, kBlock, shared_bytes) * sms);
              at::Tensor scratch;
              if (!in_shared && column_sums) {
                scratch = at::empty({grid, column_bytes / int64_t{sizeof(acc_t)}}, stat_options);
              }
              acc_t* scratch_ptr = scratch.defined() ? scratch.mutable_data_ptr<acc_t>() : nullptr;
              kernel<<<grid, kBlock, shared_bytes, stream>>>(dyp, xp, mp, rp, wp, gsp, dxp, rows, cols, scratch_ptr,
                                                             partial_ptr);
              C10_CUDA_KERNEL_LAUNCH_CHECK();
            });
          };
          TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(), op, ": too many rows for one launch: ", rows);
          if (cols <= warp_rows) {
            constexpr unsigned kRowsPerBlock = Tuning::kWarpRowsBlock / kWarpSize;
            launch(std::integral_constant<unsigned, kWarpSize>(),
                   std::integral_constant<unsigned, Tuning::kWarpRowsBlock>(),
                   (rows + kRowsPerBlock - 1) / kRowsPerBlock);
          } else {
            launch(std::integral_constant<unsigned, Tuning::kStreamingBlock>(),
                   std::integral_constant<unsigned, Tuning::kStreamingBlock>(), rows);
          }
        }
        if (column_sums) {
          const int64_t tiles = (slots + Tuning::kFoldTile - 1) / Tuning::kFoldTile;
          TORCH_CHECK(tiles <= std::numeric_limits<int32_t>::max(), op, ": normalized size too large: ", cols);
          constexpr unsigned kFoldThreads = Tuning::kFoldTile * Tuning::kFoldLanes;
          column_fold_kernel<Tuning, param_t, acc_t><<<tiles, kFoldThreads, 0, stream>>>(
              partials.const_data_ptr<acc_t>(), grid, slots, cols, partial_vectors,
              grad_weight.numel() > 0 ? grad_weight.mutable_data_ptr<param_t>() : nullptr,
              grad_bias.numel() > 0 ? grad_bias.mutable_data_ptr<param_t>() : nullptr);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
      });
    });
  });
  return {grad_input, grad_weight, grad_bias};
}

// The backward kernels as norm_ops.h's backend.
struct CudaNormBackward {
  template <RowNorm kNorm, typename... Args>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const Args&... args) {
    return row_norm_bwd<kNorm>(args...);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CUDA, m) { NormOps<CudaNormBackward>::register_backwards(m); }

}  // namespace torch_reduce::cuda
