#pragma once
// The global gradient norm: foreach_norm (torch._foreach_norm: a 0-dim norm per tensor), total_norm (the norm of
// every element of a list, torch.nn.utils.get_total_norm's value) and clip_grads_ (the in-place scaling of
// torch.nn.utils.clip_grads_with_norm_). The checks, the device grouping and the clip coefficient are shared by
// the CPU and CUDA kernels; torch_reduce/grad_norm.py builds clip_grad_norm_ on them.
//
// A list may mix devices and dtypes, and hold sparse COO gradients (their values go to the dense kernels). The
// dispatcher sends a list holding a CUDA tensor to the CUDA kernel, which runs each device's tensors there (the
// CPU's through the CPU kernel) in one pass per device; the totals of several devices are combined on the first
// tensor's device, as torch combines its groups.
#include <ATen/ATen.h>

#include <optional>
#include <utility>
#include <vector>

#include "common/reduce_ops.h"

namespace torch_reduce {

// torch's checks of each tensor, in its order and words: a floating or complex dtype, dtype= as
// linalg.vector_norm takes it (complex for a complex tensor, real for a real one, reached without narrowing), and
// no empty tensor for the orders without an identity (inf and below 0). An empty list raises, as
// torch._foreach_norm does.
void check_norm_list(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype);
// grads floating or complex, total_norm a 0-dim floating tensor, then check_scalable of each.
void check_clip_grads(at::TensorList grads, const at::Tensor& total_norm, const char* op);
// torch's errors for a gradient that its in-place product cannot scale (an expanded one, an inference tensor outside
// inference mode), raised whether or not it would be scaled (the CPU kernel skips a coefficient of 1) and before any
// gradient is.
void check_scalable(const at::Tensor& g);
// The second of those alone, for a gradient known to be dense (no element shares memory).
void check_not_inference(const at::Tensor& g);

// Whether torch's CUDA _foreach_norm folds the square of `t`, a one-element tensor, at order 2: in its fast route
// (`fast_route`: a list of one dtype and device, real and dense), in float32 (float64 for a float64 tensor or
// dtype=float64): inf past 1.8e19 and 0 below 4e-23 in float32, where linalg.vector_norm gives the magnitude.
bool norm_folds_square(const at::Tensor& t, double ord, bool fast_route);
// Whether torch's norm of `t` is its one element's magnitude, not the root of a fold of |x|^p (inf or 0 where that
// leaves float32's range: a 0-dim float32 gradient of 3e19 at order 3): at every order but 0, except where torch's
// CUDA _foreach_norm folds its square (norm_folds_square; orders 1 and inf give the magnitude either way). torch's
// per-tensor route (linalg.vector_norm) gives the magnitude.
bool norm_is_magnitude(const at::Tensor& t, double ord, bool fast_route = false);
// Whether torch's CUDA _foreach_norm takes `tensors`, one call's list, in its fast route.
bool torch_fast_route(at::TensorList tensors);
// Each tensor's fast route as torch's get_total_norm meets it: on its foreach route one _foreach_norm call per
// device and dtype, else linalg.vector_norm per tensor (no fast route).
std::vector<char> total_fast_routes(at::TensorList tensors, bool foreach);
// Each tensor's norm_is_magnitude there.
std::vector<char> total_magnitudes(at::TensorList tensors, double ord, bool foreach);

// total_norm's dtype: the real types of the tensors' dtypes promoted, as torch.stack promotes the per-tensor norms.
at::ScalarType total_norm_dtype(at::TensorList tensors);

// What the kernels, which read real numbers, take for a list: a complex tensor's norm is its magnitudes' (a real
// norm in the real type of dtype=). Order 2 reads the (real, imaginary) pairs in place (the same sum of squares);
// the other orders read |z|, computed first (magnitudes).
struct NormOperands {
  std::vector<at::Tensor> tensors;
  std::optional<at::ScalarType> dtype;     // dtype='s real type
  std::vector<at::ScalarType> norm_types;  // each norm's: dtype='s, else its tensor's real type
};
NormOperands real_operands(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype);
// |x| of each element; for a complex tensor computed as torch's norm kernels compute it: in dtype= where given (a
// complex dtype), complex32's in complex64.
at::Tensor magnitudes(const at::Tensor& t, std::optional<at::ScalarType> dtype);
// The gradients as the scaling kernels take them: a complex one as its (real, imaginary) pairs, in place.
std::vector<at::Tensor> real_views(at::TensorList grads);

// The list's positions grouped by device, the devices in the order they first appear.
std::vector<std::pair<at::Device, std::vector<int64_t>>> group_by_device(at::TensorList tensors);
std::vector<at::Tensor> select(at::TensorList tensors, const std::vector<int64_t>& positions);

// A tensor whose elements lie densely in [data_ptr, data_ptr + numel): the tensor itself when it is
// non-overlapping and dense (any order of its dims), else a contiguous copy.
at::Tensor dense_elements(const at::Tensor& t);

// torch's clip coefficient, clamp(max_norm / (total_norm + 1e-6), max=1), in total_norm's dtype with torch's
// roundings (max_norm / t is t.reciprocal() * max_norm in torch).
at::Tensor clip_coefficient(const at::Tensor& total_norm, double max_norm);

// The total of a list folded in parts (several tables of the CUDA kernel, several devices) from the parts' sums
// (`sums`: [parts, 2], each part's accumulator and the float32 sum of its norms' rounded terms): the accumulators
// folded as one list's (a maximum, a minimum or a sum by the order), in the range of the rounded sums' sum
// (`rounded_range`: in_rounded_range) and of float32 but for a float64 total, projected, in `total_type`.
at::Tensor total_of_sums(const at::Tensor& sums, double ord, bool rounded_range, at::ScalarType total_type);

// What a tensor's fold contributes to the total's, torch's norm of the per-tensor norms: its accumulator; for order
// 0 whether it counted any non-zero element (torch's total 0-norm counts tensors); for order NaN the term of its norm
// (NaN unless the norm is 1: an empty tensor's, 0, makes the total NaN). The only tensor of a list contributes its
// accumulator, but for order 0 (torch's norm of one norm is its magnitude).
template <typename Ops, typename T>
TR_HOST_DEVICE T tensor_contribution(const Ops& ops, T tensor_accumulator, bool only_tensor) {
  if constexpr (std::is_base_of_v<NormZeroOp<T>, Ops>) {
    return ops.transform(tensor_accumulator);
  } else if constexpr (std::is_same_v<Ops, NormPOp<T>>) {
    return ops.p != ops.p && !only_tensor ? ops.transform(ops.project(tensor_accumulator)) : tensor_accumulator;
  } else {
    return tensor_accumulator;
  }
}

// torch folds a tensor's norm in float32 unless the tensor (or dtype=) is float64 (its _foreach_norm), and
// get_total_norm takes the norm of those per-tensor norms, each rounded to its dtype. Ours fold wider (a list with a
// float64 tensor in float64, the CPU's in double) and combine the unrounded sums; these two keep torch's range where a
// tensor's fold or norm leaves it.
//
// `ops` with each term that leaves float32's normal range as float32 holds it (inf, a subnormal or 0: 1e-30 squared
// is 0, as in torch's fold of a float32 or 16-bit tensor); a term within that range stays exact, so the range is
// torch's and the sum no less accurate than a wide fold's.
template <typename Ops>
struct Float32RangeTerms : Ops {
  using T = decltype(Ops::identity());
  TR_HOST_DEVICE T transform(T x) const {
    const T term = Ops::transform(x);
    const float held = static_cast<float>(term);
    return std::isinf(held) || std::fabs(held) < std::numeric_limits<float>::min() ? static_cast<T>(held) : term;
  }
};

// A tensor's accumulator (unprojected) as torch's norm of it leaves it, the norm of C++ type norm_t: where a sum that
// torch folds in float32 (`float32_fold`) leaves float32's range, or the norm leaves norm_t's (a float16 norm beyond
// 65504), torch's norm is inf or 0, and the accumulator becomes that norm's. Elsewhere it stays as folded (closer to
// the exact norm than torch's rounded one). Counts (order 0) leave no range.
template <typename norm_t, typename Ops, typename T>
TR_HOST_DEVICE T in_torch_range(const Ops& ops, T accumulator, bool float32_fold) {
  if constexpr (std::is_same_v<norm_t, double> || std::is_base_of_v<NormZeroOp<T>, Ops>) {
    return accumulator;
  } else {
    if (float32_fold && std::isinf(static_cast<float>(accumulator))) accumulator = std::numeric_limits<T>::infinity();
    const T norm = project_result(ops, accumulator);
    const T rounded = static_cast<T>(static_cast<norm_t>(norm));
    const bool leaves_range = (std::isinf(rounded) && !std::isinf(norm)) || (rounded == T(0) && norm != T(0));
    return leaves_range ? load_element<T>(ops, rounded) : accumulator;
  }
}

// torch's total is the norm of its per-tensor norms stacked, each rounded to its dtype, folded in float32 unless the
// total is float64; ours folds the unrounded norms (closer to the exact total). Where that rounding carries the
// sum of the terms across float32's largest (a bfloat16 norm of 1.8445e19 rounds up to 2^64, whose square is inf),
// the two disagree on overflow, so the fold keeps a second sum, of the rounded norms' terms in float32, for its
// range alone (in_rounded_range). Orders that sum powers only: a maximum, a minimum or a count leaves no range.
template <typename Ops>
TR_HOST_DEVICE bool sums_powers(const Ops& ops) {
  using T = decltype(Ops::identity());
  if constexpr (std::is_base_of_v<NormZeroOp<T>, Ops> || !std::is_base_of_v<SumOp<T>, Ops>) {
    return false;
  } else if constexpr (std::is_same_v<Ops, NormPOp<T>>) {
    return ops.p == ops.p;  // order NaN: the total is NaN or 1 whatever the rounding
  } else {
    return true;
  }
}

// A tensor's term in torch's fold of the rounded norms: its norm (from its accumulator in torch's range) rounded to
// norm_t, raised to the order, in float32.
template <typename norm_t, typename Ops, typename T>
TR_HOST_DEVICE float rounded_norm_term(const Ops& ops, T tensor_accumulator) {
  const norm_t norm = static_cast<norm_t>(project_result(ops, tensor_accumulator));
  return static_cast<float>(ops.transform(static_cast<T>(static_cast<float>(norm))));
}

// A total's accumulator where it and `rounded_sum` (torch's float32 sum of the rounded terms) disagree on
// overflow: the rounded sum, torch's; elsewhere the accumulator itself.
template <typename Ops, typename T>
TR_HOST_DEVICE T in_rounded_range(const Ops& ops, T accumulator, float rounded_sum) {
  const bool disagree = std::isinf(rounded_sum) != std::isinf(static_cast<float>(accumulator));
  return sums_powers(ops) && disagree ? static_cast<T>(rounded_sum) : accumulator;
}

namespace cpu {
// The CPU kernels, for every tensor on the CPU; the CUDA kernels call them for a list's CPU tensors.
std::vector<at::Tensor> foreach_norm(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype);
at::Tensor total_norm(at::TensorList tensors, double ord, bool foreach);
// A list's part of a total of `total_type` (a list spread over devices): its accumulator and the float32 sum of its
// norms' rounded terms (total_of_sums), a [1, 2] float64 tensor.
at::Tensor total_sums(at::TensorList tensors, double ord, at::ScalarType total_type, bool only_tensor);
void clip_grads_(at::TensorList grads, const at::Tensor& total_norm, double max_norm);
}  // namespace cpu

// clip_grad_norm_ from a backend's total_norm and clip_grads_.
using TotalNormKernel = at::Tensor (*)(at::TensorList, double, bool);
using ClipGradsKernel = void (*)(at::TensorList, const at::Tensor&, double);
template <TotalNormKernel kTotalNorm, ClipGradsKernel kClipGrads>
at::Tensor clip_grad_norm(at::TensorList grads, double max_norm, double norm_type, bool foreach) {
  at::Tensor total = kTotalNorm(grads, norm_type, foreach);
  kClipGrads(grads, total, max_norm);
  return total;
}

}  // namespace torch_reduce
