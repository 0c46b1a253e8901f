// torch.var_mean on the GPU: the reduced dims moved last (layernorm.h: var_mean_problem), each row's
// statistics by row_layout.cuh's machinery (row_stats: two sums over a row in registers, Welford runs over a
// streamed one); too few rows to fill the GPU (var_mean over everything): each row split over blocks, a
// Welford partial per block, folded by one block per row in a fixed order.
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

// var from a row's Welford statistics: m2 / divisor, or NaN where the mean is not finite (an inf or NaN in the
// row: torch's (x - mean)^2 is NaN there; a one-element Welford run keeps m2 = 0 even for x = NaN or inf, and
// an expanded row is read as one element).
template <typename acc_t>
__device__ __forceinline__ acc_t variance(const Welford<acc_t>& w, acc_t divisor) {
  return isfinite(w.mean) ? w.m2 / divisor : acc_t(NAN);
}

template <typename Tuning, unsigned GROUP, unsigned BLOCK, bool kInRegisters, typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(BLOCK, Tuning::kOneTensorThreads / BLOCK)
    var_mean_rows_kernel(const scalar_t* __restrict__ in, int64_t rows, int64_t cols, acc_t divisor,
                         scalar_t* __restrict__ var, scalar_t* __restrict__ mean) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (BLOCK / GROUP) + threadIdx.x / GROUP;
  if (row >= rows) return;  // whole warps only: a block-wide group always has its row
  const unsigned t = threadIdx.x % GROUP;
  RowRegisters<scalar_t, Tuning::kItems> regs;
  if constexpr (kInRegisters) load_row<GROUP>(regs, in + row * cols, cols / Vec16<scalar_t>::kSize, t);
  const Welford<acc_t> w = row_stats<GROUP, BLOCK, kInRegisters, acc_t>(in + row * cols, in[row * cols], cols, t, regs);
  if (t == 0) {
    var[row] = static_cast<scalar_t>(variance(w, divisor));
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
    var[row] = static_cast<scalar_t>(variance(w, divisor));
    mean[row] = static_cast<scalar_t>(w.mean);
  }
}

std::tuple<at::Tensor, at::Tensor> var_mean_cuda(const at::Tensor& input, at::OptionalIntArrayRef dim,
                                                 const std::optional<at::Scalar>& correction, bool keepdim) {
  const char* op = "reduce::var_mean";
  TORCH_CHECK(input.is_cuda(), op, ": expected every tensor on one CUDA device, got the input on ", input.device());
  if (input.is_complex()) return complex_var_mean(input, dim, correction, keepdim, &var_mean_cuda, op);
  const c10::cuda::CUDAGuard guard(input.device());
  check_kernel_image_for_current_device();
  VarMeanProblem p = var_mean_problem(input, dim, correction, keepdim, op);
  const int64_t rows = p.rows.size(0), cols = p.inner;
  if (rows == 0) return p.results();
  if (cols == 0) {
    p.var.fill_(NAN);
    p.mean.fill_(NAN);
    return p.results();
  }  // torch: the mean of nothing is NaN
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t sms = multiprocessors();
  TORCH_REDUCE_DISPATCH_FLOATING(input.scalar_type(), "reduce::var_mean", [&] {
    using acc_t = acc_type<scalar_t>;
    const scalar_t* in = p.rows.const_data_ptr<scalar_t>();
    scalar_t* var = p.var.mutable_data_ptr<scalar_t>();
    scalar_t* mean = p.mean.mutable_data_ptr<scalar_t>();
    const auto divisor = static_cast<acc_t>(p.divisor);
    with_tuning([&](auto tuning) {
      using Tuning = decltype(tuning);
      constexpr unsigned kChunkBlock = Tuning::kChunkBlock;
      constexpr int64_t kMinChunk = Tuning::kMinChunk, kAlignment = Tuning::kChunkAlignment;
      if (rows < sms && cols >= 2 * kMinChunk) {
        // Too few rows to fill the GPU: split each over blocks.
        const int64_t chunks_wanted = (Tuning::kChunksPerMultiprocessor * sms + rows - 1) / rows;
        const int64_t spread = ((cols + chunks_wanted - 1) / chunks_wanted + kAlignment - 1) / kAlignment * kAlignment;
        const int64_t chunk_len = std::max(kMinChunk, spread);
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
      with_row_layout<Tuning, scalar_t, Tuning::kItems, Tuning::kMinRowBlock>(
          rows, cols, aligned16(in), sms * Tuning::kOneTensorThreads,
          [&](auto group, auto block, auto in_registers, int64_t grid) {
        var_mean_rows_kernel<Tuning, decltype(group)::value, decltype(block)::value, decltype(in_registers)::value,
                             scalar_t, acc_t><<<grid, decltype(block)::value, 0, stream>>>(in, rows, cols, divisor, var,
                                                                                           mean);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
  return p.results();
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CUDA, m) { m.impl("var_mean", &var_mean_cuda); }

}  // namespace torch_reduce::cuda
