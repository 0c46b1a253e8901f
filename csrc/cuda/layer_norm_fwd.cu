// LayerNorm forward on the GPU: each row's statistics by row_layout.cuh's machinery (the row stays in
// registers between the statistics and the normalization, so x is read once), then
// y = (x - mean) * rstd * weight + bias, stored with 16-byte vectors. weight and bias have the input's
// dtype or are float32 beside a 16-bit input (param_t); mean and rstd are kept in float32 (float64 for a
// float64 input) for the backward.
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

template <typename Tuning, unsigned GROUP, unsigned BLOCK, bool kInRegisters, typename scalar_t, typename param_t,
          typename acc_t>
__global__ void __launch_bounds__(BLOCK, Tuning::kOneTensorThreads / BLOCK)
    layer_norm_fwd_kernel(const scalar_t* __restrict__ in, const param_t* __restrict__ weight,
                          const param_t* __restrict__ bias, scalar_t* __restrict__ out, acc_t* __restrict__ mean_out,
                          acc_t* __restrict__ rstd_out, int64_t rows, int64_t cols, acc_t eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (BLOCK / GROUP) + threadIdx.x / GROUP;
  if (row >= rows) return;
  const unsigned t = threadIdx.x % GROUP;
  const scalar_t* x = in + row * cols;
  constexpr int kItems = Tuning::kItems;
  RowRegisters<scalar_t, kItems> regs;
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
      acc_t wv[V::kSize], bv[V::kSize];
      if (weight != nullptr) load_params(weight, i * V::kSize, wv);
      if (bias != nullptr) load_params(bias, i * V::kSize, bv);
      V o;
#pragma unroll
      for (int e = 0; e < V::kSize; ++e) {
        acc_t v = (static_cast<acc_t>(regs.v[k].value[e]) - mean) * rstd;
        if (weight != nullptr) v *= wv[e];
        if (bias != nullptr) v += bv[e];
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd_cuda(const at::Tensor& input,
                                                                   c10::SymIntArrayRef normalized_shape,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   const std::optional<at::Tensor>& bias, double eps) {
  const char* op = "reduce::layer_norm_fwd";
  TORCH_CHECK(input.is_cuda(), op, ": expected every tensor on one CUDA device, got the input on ", input.device());
  const LayerNormShape s = layer_norm_shape(input, normalized_shape, weight, bias, op);
  check_eps(eps, op);
  const c10::cuda::CUDAGuard guard(input.device());
  check_kernel_image_for_current_device();
  const at::Tensor x = input.contiguous();
  const at::Tensor w = defined(weight) ? weight->contiguous() : at::Tensor();
  const at::Tensor b = defined(bias) ? bias->contiguous() : at::Tensor();
  at::Tensor out = at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
  const auto stat_options = input.options().dtype(stat_scalar_type(input.scalar_type()));
  at::Tensor mean = at::empty(s.stat_shape, stat_options), rstd = at::empty(s.stat_shape, stat_options);
  if (s.rows == 0 || s.cols == 0) return {out, mean.fill_(NAN), rstd.fill_(NAN)};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  TORCH_REDUCE_DISPATCH_FLOATING(input.scalar_type(), "reduce::layer_norm_fwd", [&] {
    with_param_type<scalar_t>(s.param_type, [&](auto param) {
      using param_t = decltype(param);
      using acc_t = acc_type<scalar_t>;
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const param_t* wp = w.defined() ? w.const_data_ptr<param_t>() : nullptr;
      const param_t* bp = b.defined() ? b.const_data_ptr<param_t>() : nullptr;
      scalar_t* yp = out.mutable_data_ptr<scalar_t>();
      const bool aligned = aligned16(xp) && aligned16(wp) && aligned16(bp) && aligned16(yp);
      with_tuning([&](auto tuning) {
        using Tuning = decltype(tuning);
        with_row_layout<Tuning, scalar_t, Tuning::kItems, Tuning::kMinRowBlock>(
            s.rows, s.cols, aligned, multiprocessors() * Tuning::kOneTensorThreads,
            [&](auto group, auto block, auto in_registers, int64_t grid) {
          layer_norm_fwd_kernel<Tuning, decltype(group)::value, decltype(block)::value, decltype(in_registers)::value,
                                scalar_t, param_t, acc_t><<<grid, decltype(block)::value, 0, stream>>>(
              xp, wp, bp, yp, mean.mutable_data_ptr<acc_t>(), rstd.mutable_data_ptr<acc_t>(), s.rows, s.cols,
              static_cast<acc_t>(eps));
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
    });
  });
  return {out, mean, rstd};
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CUDA, m) { m.impl("layer_norm_fwd", &layer_norm_fwd_cuda); }

}  // namespace torch_reduce::cuda
