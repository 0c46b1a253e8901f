#pragma once
// dtype dispatch and accumulate types, in one place for every kernel family.
#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>

#include <type_traits>
#include <utility>

// Every reduction accepts the floating types (fp32, fp64, fp16, bf16), the integers and bool.
#define TORCH_REDUCE_DISPATCH(TYPE, NAME, ...) \
  AT_DISPATCH_V2(TYPE, NAME, AT_WRAP(__VA_ARGS__), AT_EXPAND(AT_ALL_TYPES), at::kHalf, at::kBFloat16, at::kBool)

// The dim reductions also take uint16/uint32/uint64 (sums and products to int64, as torch).
#define TORCH_REDUCE_DISPATCH_DIM(TYPE, NAME, ...)                                                  \
  AT_DISPATCH_V2(TYPE, NAME, AT_WRAP(__VA_ARGS__), AT_EXPAND(AT_ALL_TYPES),                         \
                 AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES), at::kHalf, at::kBFloat16, at::kBool)

// Statistics (var_mean, LayerNorm) take the floating types only.
#define TORCH_REDUCE_DISPATCH_FLOATING(TYPE, NAME, ...) \
  AT_DISPATCH_V2(TYPE, NAME, AT_WRAP(__VA_ARGS__), AT_EXPAND(AT_FLOATING_TYPES), at::kHalf, at::kBFloat16)

namespace torch_reduce {

// Calls f(std::integral_constant<unsigned, V>) for a run-time power of two `value` in [LO, HI] (a block size,
// lanes per row), so a kernel can take it as a template parameter.
template <unsigned LO, unsigned HI, typename F>
void with_power_of_two(int64_t value, F&& f) {
  if constexpr (LO >= HI) {
    f(std::integral_constant<unsigned, HI>());
  } else if (value <= LO) {
    f(std::integral_constant<unsigned, LO>());
  } else {
    with_power_of_two<LO * 2, HI>(value, std::forward<F>(f));
  }
}

// Calls f(param_t()) with the C++ type of LayerNorm's weight and bias for a scalar_t input: scalar_t, or float
// for a 16-bit input with float32 parameters (mixed precision).
template <typename scalar_t, typename F>
void with_param_type(at::ScalarType param_type, F&& f) {
  if constexpr (sizeof(scalar_t) == 2) {
    if (param_type == at::kFloat) return f(float());
  }
  f(scalar_t());
}

// What a reduction accumulates in, as torch.sum does: 16-bit floats in float32, integers and bool in int64.
template <typename T>
struct AccumulateType {
  using type = int64_t;
};
template <>
struct AccumulateType<float> {
  using type = float;
};
template <>
struct AccumulateType<double> {
  using type = double;
};
template <>
struct AccumulateType<c10::Half> {
  using type = float;
};
template <>
struct AccumulateType<c10::BFloat16> {
  using type = float;
};
// uint64 stays unsigned, so max and min order it right; its sums and products wrap to int64's bits.
template <>
struct AccumulateType<uint64_t> {
  using type = uint64_t;
};
template <typename T>
using acc_type = typename AccumulateType<T>::type;

// torch.sum's result dtype: floating and complex inputs keep theirs, integers and bool give int64.
inline at::ScalarType sum_result_type(at::ScalarType t) {
  return at::isFloatingType(t) || at::isComplexType(t) ? t : at::kLong;
}

// A clear error for complex, float8, unsigned 16/32/64-bit and every other dtype the dispatch above skips.
inline void check_reducible_dtype(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong: case at::kBool:
      return;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, op, ": unsupported dtype ", t.scalar_type(),
                                  "; expected float32, float64, float16, bfloat16, an integer type (int8..int64, "
                                  "uint8) or bool");
  }
}

}  // namespace torch_reduce
