#pragma once
// torch.sum / mean / amax / amin with torch's semantics, shared by the CPU and CUDA kernels: the argument
// rules (dims, keepdim, dtype=, empty inputs, errors) and the layout, normalised to (outer B, reduced K,
// inner N) over one dense run of memory: out[b, n] = reduce over k of in[(b * K + k) * N + n].
// Each backend supplies only a launcher for that normal form.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <type_traits>

#include "common/dispatch.h"
#include "common/reduce_ops.h"

namespace torch_reduce {

enum class Reduction { Sum, Mean, Amax, Amin };

struct ReduceProblem {
  at::Tensor input;  // a contiguous 1-D view of the B * K * N elements, in the normal form's order
  int64_t outer;     // B
  int64_t reduced;   // K
  int64_t inner;     // N
};

// Writes the reduction of `problem` into `out`: B * N contiguous elements of kernel_result_type().
using ReduceLauncher = void (*)(Reduction, const ReduceProblem& problem, const at::Tensor& out);

// What a kernel writes: integer and bool sums in int64 (the accumulate type), everything else in the
// input's dtype; a requested narrower integer dtype is a cast of that afterwards.
inline at::ScalarType kernel_result_type(Reduction r, at::ScalarType input) {
  return r == Reduction::Sum ? sum_result_type(input) : input;
}

// The registered ops' bodies: checks, then `launch` on the normal form (or a shortcut for empty inputs),
// with the input's device current.
at::Tensor reduce_dims(Reduction r, const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                       std::optional<at::ScalarType> dtype, ReduceLauncher launch);

// Registers sum/mean/amax/amin for one backend (the TORCH_LIBRARY_IMPL of its dispatch key): the same
// bodies, each backend bringing only its launcher.
template <ReduceLauncher kLaunch>
void impl_dim_reductions(torch::Library& m) {
  m.impl("sum", [](const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dtype) {
    return reduce_dims(Reduction::Sum, self, dim, keepdim, dtype, kLaunch);
  });
  m.impl("mean", [](const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                    std::optional<at::ScalarType> dtype) {
    return reduce_dims(Reduction::Mean, self, dim, keepdim, dtype, kLaunch);
  });
  m.impl("amax", [](const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
    return reduce_dims(Reduction::Amax, self, dim, keepdim, std::nullopt, kLaunch);
  });
  m.impl("amin", [](const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
    return reduce_dims(Reduction::Amin, self, dim, keepdim, std::nullopt, kLaunch);
  });
}

// The kernel's element types for dtype scalar_t and operator Op: out_t is what kernel_result_type says.
template <typename scalar_t, typename Op>
using kernel_out_t = std::conditional_t<std::is_same_v<Op, SumOp<acc_type<scalar_t>>> &&
                                            !std::is_floating_point_v<acc_type<scalar_t>>,
                                        int64_t, scalar_t>;

// Calls f(op, project) with the combine operator and final projection of `r` over acc_type<scalar_t>;
// mean divides by the reduced count K (mean is only reached for floating inputs).
template <typename scalar_t, typename F>
void with_reduction(Reduction r, int64_t reduced_count, F&& f) {
  using acc_t = acc_type<scalar_t>;
  switch (r) {
    case Reduction::Sum: return f(SumOp<acc_t>(), KeepValue());
    case Reduction::Mean:
      if constexpr (std::is_floating_point_v<acc_t>) return f(SumOp<acc_t>(), DivideBy<acc_t>{acc_t(reduced_count)});
      TORCH_CHECK(false, "torch_reduce: mean of a non-floating dtype reached a kernel");
    case Reduction::Amax: return f(MaxOp<acc_t>(), KeepValue());
    case Reduction::Amin: return f(MinOp<acc_t>(), KeepValue());
  }
}

}  // namespace torch_reduce
