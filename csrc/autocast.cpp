// Autocast: each op gets the policy torch gives its matching aten op (aten/src/ATen/autocast_mode.cpp).
// On CUDA:
//   layer_norm_fwd     as aten::layer_norm: fp32 (every floating input cast to float32, a float32 result);
//   rms_norm_fwd       as aten::rms_norm in the torch that runs: fp32 where torch casts it (its autocast lists
//                      gained rms_norm after 2.11), else as called;
//   add_layer_norm_fwd, add_rms_norm_fwd
//                      as `x + r` then the norm (see add_layer_norm_fwd_autocast);
//   sum, prod, vector_norm, the ladder
//                      as aten::sum, prod, linalg_vector_norm: fp32_set_opt_dtype (a floating, non-double
//                      input without dtype= reduces to float32; the ladder ops have no dtype=, so such an
//                      input is cast to float32);
//   mean, amax, amin, var_mean, layer_norm_bwd, rms_norm_bwd: in none of torch's lists, so they run as called (the
//                      fallthrough that torch registers for every op).
// On the CPU torch autocasts only prod of these (fp32: a 16-bit input is cast to float32); the others run
// as called, and a bfloat16 activation reaches LayerNorm or RMSNorm with float32 parameters (the
// mixed-precision kernels take that).
// The casts happen above autograd, as torch's do: the backward sees float32 and the cast's own backward
// returns the input's dtype.
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "dim_reduce.h"
#include "ladder.h"
#include "layernorm.h"

namespace torch_reduce {
namespace {

constexpr auto kDevice = c10::DeviceType::CUDA;

template <typename Signature>
c10::TypedOperatorHandle<Signature> typed_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// fp32_set_opt_dtype for a row of the dim-reduction table that takes dtype=: dtype=float32 unless one is
// given or the input is not a CUDA float16/bfloat16/float32 tensor.
template <Reduction R, typename Signature>
struct Fp32SetOptDtype {
  static at::Tensor run(const at::Tensor& self, const ReduceCall& call) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
    ReduceCall cast = call;
    if (!call.dtype.has_value() && at::autocast::is_eligible(self, kDevice)) cast.dtype = at::kFloat;
    return Signature::call(dim_reduction_op<R, Signature>(), self, cast);
  }
};

// fp32 on the CPU: a 16-bit floating input is cast to float32 first.
template <Reduction R, typename Signature>
struct CpuFp32 {
  static at::Tensor run(const at::Tensor& self, const ReduceCall& call) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    return Signature::call(dim_reduction_op<R, Signature>(),
                           at::autocast::cached_cast(at::kFloat, self, c10::DeviceType::CPU), call);
  }
};

template <Ladder kVariant>
at::Tensor ladder_autocast(const at::Tensor& t, int64_t block_size) {
  static const auto op = typed_op<at::Tensor(const at::Tensor&, int64_t)>(ladder_op_name(kVariant));
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return op.call(at::autocast::cached_cast(at::kFloat, t, kDevice), block_size);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd_autocast(const at::Tensor& input,
                                                                       c10::SymIntArrayRef normalized_shape,
                                                                       const std::optional<at::Tensor>& weight,
                                                                       const std::optional<at::Tensor>& bias,
                                                                       double eps) {
  using Optional = std::optional<at::Tensor>;
  static const auto op = typed_op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, c10::SymIntArrayRef, const Optional&, const Optional&, double)>("reduce::layer_norm_fwd");
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return op.call(at::autocast::cached_cast(at::kFloat, input, kDevice), normalized_shape,
                 at::autocast::cached_cast(at::kFloat, weight, kDevice),
                 at::autocast::cached_cast(at::kFloat, bias, kDevice), eps);
}

// Whether the torch that runs casts aten::rms_norm under CUDA autocast (to float32: torch after 2.11).
bool torch_casts_rms_norm() {
  static const bool casts = c10::Dispatcher::singleton()
                                .findSchemaOrThrow("aten::rms_norm", "")
                                .hasKernelForDispatchKey(c10::DispatchKey::AutocastCUDA);
  return casts;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_fwd_autocast(const at::Tensor& input,
                                                         c10::SymIntArrayRef normalized_shape,
                                                         const std::optional<at::Tensor>& weight,
                                                         std::optional<double> eps) {
  static const auto op = typed_op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, c10::SymIntArrayRef, const std::optional<at::Tensor>&, std::optional<double>)>(
      "reduce::rms_norm_fwd");
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  if (!torch_casts_rms_norm()) return op.call(input, normalized_shape, weight, eps);
  return op.call(at::autocast::cached_cast(at::kFloat, input, kDevice), normalized_shape,
                 at::autocast::cached_cast(at::kFloat, weight, kDevice), eps);
}

// The fused add + norm as torch runs `x + r` then the norm under autocast: the add as called, the norm with its
// policy. Where that policy casts nothing (float32 or float64 inputs, or rms_norm where torch leaves it alone),
// the fused kernel gives exactly that; else (a 16-bit input and a float32 norm) the sum keeps the input's dtype
// and the norm runs in float32, which the fused kernel cannot give: x + r, then the norm's own autocast kernel.
bool norm_casts(const at::Tensor& input, bool policy_fp32) {
  return policy_fp32 && at::autocast::is_eligible(input, kDevice) && input.scalar_type() != at::kFloat;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_fwd_autocast(
    const at::Tensor& input, const at::Tensor& residual, c10::SymIntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  using Optional = std::optional<at::Tensor>;
  check_residual(input, residual, "reduce::add_layer_norm_fwd");
  if (norm_casts(input, true)) {
    static const auto norm = typed_op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, c10::SymIntArrayRef, const Optional&, const Optional&, double)>("reduce::layer_norm_fwd");
    const at::Tensor sum = input + residual;
    auto [out, mean, rstd] = norm.call(sum, normalized_shape, weight, bias, eps);
    return {out, sum, mean, rstd};
  }
  static const auto op = typed_op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, const Optional&, const Optional&, double)>(
      "reduce::add_layer_norm_fwd");
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return op.call(input, residual, normalized_shape, at::autocast::cached_cast(at::kFloat, weight, kDevice),
                 at::autocast::cached_cast(at::kFloat, bias, kDevice), eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_fwd_autocast(const at::Tensor& input,
                                                                         const at::Tensor& residual,
                                                                         c10::SymIntArrayRef normalized_shape,
                                                                         const std::optional<at::Tensor>& weight,
                                                                         std::optional<double> eps) {
  using Optional = std::optional<at::Tensor>;
  check_residual(input, residual, "reduce::add_rms_norm_fwd");
  const bool policy_fp32 = torch_casts_rms_norm();
  if (norm_casts(input, policy_fp32)) {
    static const auto norm = typed_op<std::tuple<at::Tensor, at::Tensor>(
        const at::Tensor&, c10::SymIntArrayRef, const Optional&, std::optional<double>)>("reduce::rms_norm_fwd");
    const at::Tensor sum = input + residual;
    auto [out, rstd] = norm.call(sum, normalized_shape, weight, eps);
    return {out, sum, rstd};
  }
  static const auto op = typed_op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, const Optional&, std::optional<double>)>(
      "reduce::add_rms_norm_fwd");
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return op.call(input, residual, normalized_shape,
                 policy_fp32 ? at::autocast::cached_cast(at::kFloat, weight, kDevice) : weight, eps);
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, AutocastCUDA, m) {
  m.impl("sum", &DimsDtype::bind<Fp32SetOptDtype<Reduction::Sum, DimsDtype>>);
  m.impl("prod", &DimsDtype::bind<Fp32SetOptDtype<Reduction::Prod, DimsDtype>>);
  m.impl("vector_norm", &OrdDimsDtype::bind<Fp32SetOptDtype<Reduction::VectorNorm, OrdDimsDtype>>);
  m.impl("layer_norm_fwd", &layer_norm_fwd_autocast);
  m.impl("rms_norm_fwd", &rms_norm_fwd_autocast);
  m.impl("add_layer_norm_fwd", &add_layer_norm_fwd_autocast);
  m.impl("add_rms_norm_fwd", &add_rms_norm_fwd_autocast);
#define TORCH_REDUCE_AUTOCAST(name, variant) m.impl(#name, &ladder_autocast<Ladder::variant>);
  TORCH_REDUCE_LADDER(TORCH_REDUCE_AUTOCAST)
#undef TORCH_REDUCE_AUTOCAST
}

TORCH_LIBRARY_IMPL(reduce, AutocastCPU, m) { m.impl("prod", &DimsDtype::bind<CpuFp32<Reduction::Prod, DimsDtype>>); }

}  // namespace torch_reduce
