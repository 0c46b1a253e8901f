// LayerNorm and RMSNorm forward on the GPU (one kernel, RowNorm says which): each row's statistics by
// row_layout.cuh's machinery (the row stays in registers between the statistics and the normalization, so x
// is read once), then y = (x - mean) * rstd * weight + bias (RMSNorm: x * rstd * weight), stored with
// 16-byte vectors. weight and bias have the input's dtype or are float32 beside a 16-bit input (param_t);
// mean and rstd are kept in float32 (float64 for a float64 input) for the backward. With a residual
// (add_layer_norm, add_rms_norm), the row normalized is x + residual, rounded to the input's dtype as torch's
// add rounds it and stored as `sum`: one read of each input, two writes.
// Against a copy of the same bytes (torch's x * 2; H200, graph replay, ten shapes of 2^24-2^28 elements): the op
// alone takes 1.03-1.16x its time (RMSNorm, median 1.05x) and 1.04-1.33x (LayerNorm, median 1.12x), and the copy
// itself reaches 79-89% of the line there (benchmarks/results/nvidia-h200/norm_forward_staged.md).
// Measured on the H200 and kept out:
// - a block-a-row grid of resident blocks, each taking rows one after another with the next staged in shared
//   memory by cp.async (each thread its own vectors) while one is computed: 0.87-1.08x over 20 LayerNorm and
//   RMSNorm cases (geomean 0.94; bfloat16 RMSNorm 16384x4096 69.2 -> 78.2 us; only LayerNorm bfloat16 2048x18432
//   gained, 52.0 -> 48.1);
// - x loaded and y stored with evict-first hints (ld/st.global.cs): RMSNorm 0-11% faster, LayerNorm up to 17%
//   slower (benchmarks/results/nvidia-h200/norm_half_and_unsplit_columns.md);
// - more threads a row (at most 4 or 2 vectors a thread, the layouts of Liger-Kernel's Triton kernels) with the
//   kernel of 8 vectors (64 registers): float32 2048x4096 LayerNorm 23.4 -> 21.3 us at one or two waves of rows,
//   bfloat16 16384x4096 74.0 -> 79.7-87.6 at many (benchmarks/results/nvidia-h200/norm_forward_layouts.md). With
//   kernels compiled for 4 and 2 vectors at 1280 and 1536 threads an SM, at most 4 is kept for float32 LayerNorm
//   (tuning.h, kFloatLayerNormItems); at most 2 and 1 lost (LayerNorm geomean 0.95x and 0.71x over 32 cases,
//   float32 16384x8192 0.61x at both), and the kernel of 2 spilled at 32 and 40 registers (LayerNorm, bfloat16:
//   104-208 bytes);
// - the row's sums in four accumulators a thread (add chains a quarter as long): LayerNorm geomean 1.01x over the
//   same 32 cases where the kernel of 4 alone gave 1.03x, RMSNorm 1.00x
//   (benchmarks/results/nvidia-h200/logs/ab_forward_half_items.jsonl);
// - (H100, the ops alone, graph replay, one build switching at run time, two processes each, the 17 cases furthest
//   behind Liger-Kernel; benchmarks/results/nvidia-h100/logs/ab_forward_one_item_params_first.jsonl) Liger's
//   16-bit layout and occupancy, one vector a thread in a kernel compiled for 2048 threads an SM (32 registers):
//   LayerNorm float32 0.82-1.00x, bfloat16 0.66-0.92x (ptxas: 16-bit LayerNorm spills 24-32 bytes there), RMSNorm
//   0.83-1.03x; and the kernel of kHalfItems loading the weight and bias with the row (at 1024 threads an SM, as
//   Liger's float32 kernel at 4096 columns: 64 registers): float32 LayerNorm 0.97-1.06x (1024x4096 12.90 -> 12.23
//   us, Liger 11.33; 2048x4096 25.90 -> 26.70), RMSNorm 0.97-1.07x, 16-bit spills 128-200 bytes (bfloat16
//   LayerNorm 16384x1024 27.1 -> 45.8 us).
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

template <typename acc_t>
__device__ __forceinline__ acc_t reciprocal_sqrt(acc_t v) {
  if constexpr (std::is_same_v<acc_t, double>) {
    return ::rsqrt(v);
  } else {
    return ::rsqrtf(v);
  }
}

// kResidual: a fused add + norm (residual and sum_out given). A template flag, so the ordinary kernels keep
// their registers: as a run-time branch the add spilled the float32 LayerNorm kernels (ptxas, sm_90).
// ITEMS: the vectors of a row a thread holds at most: Tuning::kParamsFirstItems (those kernels load the weight and
// bias with the row, before the statistics), Tuning::kHalfItems (compiled for more resident threads) or
// Tuning::kItems, the fewest that hold what the layout gives a thread.
template <typename Tuning, RowNorm kNorm, unsigned GROUP, unsigned BLOCK, int ITEMS, bool kInRegisters, bool kResidual,
          typename scalar_t, typename param_t, typename acc_t>
__global__ void __launch_bounds__(BLOCK, Tuning::norm_forward_threads(ITEMS) / BLOCK)
    row_norm_fwd_kernel(const scalar_t* __restrict__ in, const scalar_t* __restrict__ residual,
                        const param_t* __restrict__ weight, const param_t* __restrict__ bias,
                        scalar_t* __restrict__ out, scalar_t* __restrict__ sum_out, acc_t* __restrict__ mean_out,
                        acc_t* __restrict__ rstd_out, int64_t rows, int64_t cols, acc_t eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (BLOCK / GROUP) + threadIdx.x / GROUP;
  if (row >= rows) return;
  const unsigned t = threadIdx.x % GROUP;
  const scalar_t* x = in + row * cols;
  constexpr int kItems = ITEMS;
  using V = Vec16<scalar_t>;
  const int64_t vectors = cols / V::kSize;
  RowRegisters<scalar_t, kItems> regs;
  if constexpr (kInRegisters) load_row<GROUP>(regs, x, vectors, t);
  // The weight and bias with the row, so that their loads are not waited on after the statistics
  // (Tuning::kParamsFirstItems).
  constexpr bool kParamsFirst = kInRegisters && ITEMS <= Tuning::kParamsFirstItems;
  acc_t w_first[kParamsFirst ? ITEMS : 1][V::kSize], b_first[kParamsFirst ? ITEMS : 1][V::kSize];
  if constexpr (kParamsFirst) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = t + static_cast<int64_t>(k) * GROUP;
      if (i >= vectors) continue;
      if (weight != nullptr) load_params(weight, i * V::kSize, w_first[k]);
      if (kNorm == RowNorm::Layer && bias != nullptr) load_params(bias, i * V::kSize, b_first[k]);
    }
  }
  // The row's first element, row_stats's shift (x + residual rounded as add_residual rounds it).
  scalar_t first = x[0];
  if constexpr (kResidual) {
    first = static_cast<scalar_t>(static_cast<acc_t>(first) + static_cast<acc_t>(residual[row * cols]));
  }
  if constexpr (kResidual) {  // the row is x + residual from here on
    scalar_t* sum = sum_out + row * cols;
    if constexpr (kInRegisters) {
      add_residual<GROUP, acc_t>(regs, residual + row * cols, sum, vectors, t);
    } else {
      const scalar_t* r = residual + row * cols;
      for (int64_t j = t; j < cols; j += GROUP) {
        sum[j] = static_cast<scalar_t>(static_cast<acc_t>(x[j]) + static_cast<acc_t>(r[j]));
      }
      group_sync<GROUP>();  // the group's sums are written before any thread reads them back
    }
    x = sum;
  }
  acc_t mean = 0, rstd;
  if constexpr (kNorm == RowNorm::Layer) {
    const Welford<acc_t> w = row_stats<GROUP, BLOCK, kInRegisters, acc_t>(x, first, cols, t, regs);
    mean = w.mean;
    rstd = reciprocal_sqrt(w.m2 / static_cast<acc_t>(cols) + eps);
  } else {
    const acc_t squares = group_allreduce<GROUP, BLOCK>(
        thread_sum_squares<GROUP, kInRegisters, acc_t>(x, cols, t, regs), SumOp<acc_t>());
    rstd = reciprocal_sqrt(squares / static_cast<acc_t>(cols) + eps);
  }
  repack(regs);
  if (t == 0) {
    if constexpr (kNorm == RowNorm::Layer) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  // One element: centred (LayerNorm), scaled, then weight and bias where given.
  const auto normalize = [&](acc_t xv, acc_t w, acc_t b) {
    acc_t v = kNorm == RowNorm::Layer ? (xv - mean) * rstd : xv * rstd;
    if (weight != nullptr) v *= w;
    if (kNorm == RowNorm::Layer && bias != nullptr) v += b;
    return static_cast<scalar_t>(v);
  };
  scalar_t* y = out + row * cols;
  if constexpr (kInRegisters) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = t + static_cast<int64_t>(k) * GROUP;
      if (i >= vectors) continue;
      acc_t wv[V::kSize] = {}, bv[V::kSize] = {};
      if constexpr (kParamsFirst) {
#pragma unroll
        for (int e = 0; e < V::kSize; ++e) {
          if (weight != nullptr) wv[e] = w_first[k][e];
          if (kNorm == RowNorm::Layer && bias != nullptr) bv[e] = b_first[k][e];
        }
      } else {
        if (weight != nullptr) load_params(weight, i * V::kSize, wv);
        if (kNorm == RowNorm::Layer && bias != nullptr) load_params(bias, i * V::kSize, bv);
      }
      acc_t xf[V::kSize];
      widen(regs.v[k], xf);
      V o;
#pragma unroll
      for (int e = 0; e < V::kSize; ++e) o.value[e] = normalize(xf[e], wv[e], bv[e]);
      store_vector(reinterpret_cast<V*>(y) + i, o);
    }
  } else {
    for (int64_t j = t; j < cols; j += GROUP) {
      const acc_t w = weight != nullptr ? static_cast<acc_t>(weight[j]) : acc_t(1);
      const acc_t b = kNorm == RowNorm::Layer && bias != nullptr ? static_cast<acc_t>(bias[j]) : acc_t(0);
      y[j] = normalize(static_cast<acc_t>(x[j]), w, b);
    }
  }
}

// The forward of either norm, of input or (residual defined) of input + residual: out, the sum (residual
// defined; else undefined), and the statistics (mean: LayerNorm only) in the accumulate type.
template <RowNorm kNorm>
NormForward row_norm_fwd(const at::Tensor& input, const at::Tensor& residual, c10::SymIntArrayRef normalized_shape,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                         std::optional<double> eps_arg) {
  const char* op = forward_name<kNorm>(residual.defined());
  TORCH_CHECK(input.is_cuda(), op, ": expected every tensor on one CUDA device, got the input on ", input.device());
  const LayerNormShape s = layer_norm_shape(kNorm, input, normalized_shape, weight, bias, op);
  if (residual.defined()) check_residual(input, residual, op);
  const double eps = norm_eps<kNorm>(eps_arg, input.scalar_type(), op);
  const c10::cuda::CUDAGuard guard(input.device());
  check_kernel_image_for_current_device();
  const at::Tensor x = input.contiguous();
  const at::Tensor r = residual.defined() ? residual.contiguous() : at::Tensor();
  const at::Tensor w = defined(weight) ? weight->contiguous() : at::Tensor();
  const at::Tensor b = defined(bias) ? bias->contiguous() : at::Tensor();
  const auto dense = input.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor out = at::empty(input.sizes(), dense);
  at::Tensor sum = residual.defined() ? at::empty(input.sizes(), dense) : at::Tensor();
  const auto stat_options = input.options().dtype(stat_scalar_type(input.scalar_type()));
  at::Tensor rstd = at::empty(s.stat_shape, stat_options);
  at::Tensor mean = kNorm == RowNorm::Layer ? at::empty(s.stat_shape, stat_options) : at::Tensor();
  if (s.rows == 0 || s.cols == 0) {  // statistics of empty rows: NaN, as torch's
    if (mean.defined()) mean.fill_(NAN);
    return {out, sum, mean, rstd.fill_(NAN)};
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  TORCH_REDUCE_DISPATCH_FLOATING(input.scalar_type(), "reduce::row_norm_fwd", [&] {
    with_param_type<scalar_t>(s.param_type, [&](auto param) {
      using param_t = decltype(param);
      using acc_t = acc_type<scalar_t>;
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* rp = r.defined() ? r.const_data_ptr<scalar_t>() : nullptr;
      const param_t* wp = w.defined() ? w.const_data_ptr<param_t>() : nullptr;
      const param_t* bp = b.defined() ? b.const_data_ptr<param_t>() : nullptr;
      scalar_t* yp = out.mutable_data_ptr<scalar_t>();
      scalar_t* sp = sum.defined() ? sum.mutable_data_ptr<scalar_t>() : nullptr;
      acc_t* mp = mean.defined() ? mean.mutable_data_ptr<acc_t>() : nullptr;
      const bool aligned = aligned16(xp) && aligned16(rp) && aligned16(wp) && aligned16(bp) && aligned16(yp) &&
                           aligned16(sp);
      with_tuning([&](auto tuning) {
        using Tuning = decltype(tuning);
        constexpr int kSize = Vec16<scalar_t>::kSize;
        // The most vectors a layout gives a thread (Tuning::kFloatLayerNormItems, for rows of a power-of-two number of
        // vectors, which that many a thread spread over a power-of-two block with no thread idle).
        constexpr int kLayoutItems = kNorm == RowNorm::Layer && sizeof(scalar_t) == 4 ? Tuning::kFloatLayerNormItems
                                                                                      : Tuning::kItems;
        // The kernels' widths as types: the nested lambdas below see them whole (GCC, as nvcc's host compiler, does
        // not find Tuning's members there).
        using Few = std::integral_constant<int, Tuning::kParamsFirstItems>;
        using Half = std::integral_constant<int, Tuning::kHalfItems>;
        using Full = std::integral_constant<int, Tuning::kItems>;
        const auto with_layout = [&](auto layout_items) {
          with_row_layout<Tuning, scalar_t, decltype(layout_items)::value, Tuning::kMinRowBlock, Tuning::kItems>(
              s.rows, s.cols, aligned, multiprocessors() * Tuning::kOneTensorThreads,
              [&](auto group, auto block, auto in_registers, int64_t grid) {
            const auto launch = [&](auto residual_given, auto items) {
              row_norm_fwd_kernel<Tuning, kNorm, decltype(group)::value, decltype(block)::value, decltype(items)::value,
                                  decltype(in_registers)::value, decltype(residual_given)::value, scalar_t, param_t,
                                  acc_t><<<grid, decltype(block)::value, 0, stream>>>(
                  xp, rp, wp, bp, yp, sp, mp, rstd.mutable_data_ptr<acc_t>(), s.rows, s.cols, static_cast<acc_t>(eps));
              C10_CUDA_KERNEL_LAUNCH_CHECK();
            };
            // The kernel compiled for the fewest vectors that hold a thread's.
            const auto with_items = [&](auto residual_given) {
              if constexpr (decltype(in_registers)::value) {
                const int64_t per_thread =
                  (s.cols / Vec16<scalar_t>::kSize + decltype(group)::value - 1) / decltype(group)::value;
                if (per_thread <= Few::value) return launch(residual_given, Few());
                if (per_thread <= Half::value) return launch(residual_given, Half());
              }
              launch(residual_given, Full());
            };
            rp != nullptr ? with_items(std::true_type()) : with_items(std::false_type());
          });
        };
        // Other rows, and rows too long for the widest block at kLayoutItems a thread, take up to kItems.
        const int64_t vectors = s.cols / kSize;
        const bool power_of_two = vectors > 0 && (vectors & (vectors - 1)) == 0;
        if (kLayoutItems < Full::value && power_of_two && vectors <= int64_t{Tuning::kWideRowBlock} * kLayoutItems) {
          with_layout(std::integral_constant<int, kLayoutItems>());
        } else {
          with_layout(Full());
        }
      });
    });
  });
  return {out, sum, mean, rstd};
}

// The forward kernels as norm_ops.h's backend.
struct CudaNormForward {
  template <RowNorm kNorm, typename... Args>
  static NormForward forward(const Args&... args) {
    return row_norm_fwd<kNorm>(args...);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CUDA, m) { NormOps<CudaNormForward>::register_forwards(m); }

}  // namespace torch_reduce::cuda
