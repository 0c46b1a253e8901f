// torch_reduce.sum/mean/amax/amin on the CPU: the reference path. Plain loops over the normal form
// (dim_reduce.h) in the accumulate type, outputs in parallel; a whole-tensor reduction uses the CPU model
// of the GPU's single-pass kernel (cpu/model.h), whose tree keeps the rounding error at O(log n).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "common/dispatch.h"
#include "cpu/model.h"
#include "dim_reduce.h"
#include "ladder.h"

namespace torch_reduce::cpu {
namespace {

constexpr int64_t kModelBlock = 256;

void launch_cpu(Reduction r, const ReduceProblem& p, const at::Tensor& out) {
  TORCH_REDUCE_DISPATCH(p.input.scalar_type(), "torch_reduce dim reduction", [&] {
    using acc_t = acc_type<scalar_t>;
    with_reduction<scalar_t>(r, p.reduced, [&](auto op, auto project) {
        using out_t = kernel_out_t<scalar_t, decltype(op)>;
        const scalar_t* in = p.input.const_data_ptr<scalar_t>();
        out_t* result = out.mutable_data_ptr<out_t>();
        const int64_t K = p.reduced, N = p.inner;
        if (p.outer * N == 1) {
          *result = static_cast<out_t>(project(device_reduce<acc_t>(in, K, kModelBlock, kModelMultiprocessors, true, op)));
          return;
        }
        // One (b) slab at a time: the N running values of a slab walk its K rows in order.
        at::parallel_for(0, p.outer, 1, [&](int64_t begin, int64_t end) {
          std::vector<acc_t> acc(N);
          for (int64_t b = begin; b < end; ++b) {
            std::fill(acc.begin(), acc.end(), decltype(op)::identity());
            const scalar_t* slab = in + b * K * N;
            for (int64_t k = 0; k < K; ++k)
              for (int64_t n = 0; n < N; ++n) acc[n] = op(acc[n], static_cast<acc_t>(slab[k * N + n]));
            for (int64_t n = 0; n < N; ++n) result[b * N + n] = static_cast<out_t>(project(acc[n]));
          }
        });
      });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CPU, m) { impl_dim_reductions<&launch_cpu>(m); }

}  // namespace torch_reduce::cpu
