#pragma once
// The ops objects every reduction is built from, shared by the CPU and CUDA kernels and by every kernel
// family (full, row, column, LayerNorm statistics). An ops object over the accumulate type T has
//   static identity()  the value of an empty fold: what a thread with nothing to load contributes;
//   transform(x)       optional: applied once to each element as it is loaded (|x| for a norm);
//   operator()(a, b)   the combine: associative, applied in the kernels' fixed orders;
//   project(a)         optional: the final map before the store (a / count for a mean, sqrt for a 2-norm).
// load_element and project_result below apply the optional parts, so a bare combine operator (SumOp,
// WelfordOp) is an ops object too. Partials already transformed are folded with partials_ops(ops).
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(__CUDACC__)
#define TR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TR_HOST_DEVICE inline
#endif

namespace torch_reduce {

// Whether ops.transform(a) / ops.project(a) can be called on an accumulator a (so a member template that
// enable_if removes counts as absent).
template <typename Ops, typename = void>
struct HasTransform : std::false_type {};
template <typename Ops>
struct HasTransform<Ops, std::void_t<decltype(std::declval<const Ops&>().transform(Ops::identity()))>>
    : std::true_type {};

template <typename Ops, typename = void>
struct HasProject : std::false_type {};
template <typename Ops>
struct HasProject<Ops, std::void_t<decltype(std::declval<const Ops&>().project(Ops::identity()))>>
    : std::true_type {};

// An element of the input as the fold sees it: converted to the accumulate type, then transformed.
template <typename acc_t, typename Ops, typename T>
TR_HOST_DEVICE acc_t load_element(const Ops& ops, const T& x) {
  if constexpr (HasTransform<Ops>::value) {
    return ops.transform(static_cast<acc_t>(x));
  } else {
    return static_cast<acc_t>(x);
  }
}

template <typename Ops, typename T>
TR_HOST_DEVICE T project_result(const Ops& ops, const T& a) {
  if constexpr (HasProject<Ops>::value) {
    return ops.project(a);
  } else {
    return a;
  }
}

// The parts of `Ops` one launch applies: kTransform to each element it loads, kProject to each result it
// stores; identity and combine always. A second pass over partials that were transformed when their
// elements were loaded folds with partials_ops(ops) (no transform); the stages before the last of a
// reduction split over several launches (dim_reduce.h, Stage) store unprojected(ops).
template <typename Ops, bool kTransform, bool kProject>
struct OpsPart {
  using T = decltype(Ops::identity());
  Ops ops;
  static TR_HOST_DEVICE T identity() { return Ops::identity(); }
  TR_HOST_DEVICE T operator()(const T& a, const T& b) const { return ops(a, b); }
  template <bool kHas = kTransform, std::enable_if_t<kHas, int> = 0>
  TR_HOST_DEVICE T transform(T x) const {
    return ops.transform(x);
  }
  template <bool kHas = kProject, std::enable_if_t<kHas, int> = 0>
  TR_HOST_DEVICE T project(const T& a) const {
    return project_result(ops, a);
  }
};

// `ops` itself when it transforms nothing (the same kernel as the first pass, so sum's second launch is the
// kernel it always was).
template <typename Ops>
TR_HOST_DEVICE auto partials_ops(const Ops& ops) {
  if constexpr (HasTransform<Ops>::value) {
    return OpsPart<Ops, false, HasProject<Ops>::value>{ops};
  } else {
    return ops;
  }
}

// `ops` itself when it projects nothing.
template <typename Ops>
TR_HOST_DEVICE auto unprojected(const Ops& ops) {
  if constexpr (HasProject<Ops>::value) {
    return OpsPart<Ops, HasTransform<Ops>::value, false>{ops};
  } else {
    return ops;
  }
}

template <typename T>
struct SumOp {
  static TR_HOST_DEVICE T identity() { return T(0); }
  TR_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
};

template <typename T>
struct ProdOp {
  static TR_HOST_DEVICE T identity() { return T(1); }
  TR_HOST_DEVICE T operator()(T a, T b) const { return a * b; }
};

// a < b, with -0 below +0 (IEEE 754-2019's order for maximum/minimum): max and min then pick the same zero
// whatever the fold order, so every kernel path and both backends give the same bits. (torch's choice between
// equal zeros follows their positions and its vector width; no fixed rule matches it on every input.)
// Written with `||` and `&&` on purpose, here and in MaxOp/MinOp: the GPU then branches past the zero and NaN
// tests when `b < a` settles it, which is most elements once the running max has grown. A select form (`|`, `&`:
// no branches, every test every time) was slower on the H200: amax over rows of (2^27, 2) 442 -> 548 us, of
// (2^24, 32) 562 -> 627 (graph replay, kernels that changed in nothing else). On sm_80 and newer a float max or
// min is one instruction instead (nan_maximum below); this form remains for double, the CPU and older GPUs.
template <typename T>
TR_HOST_DEVICE bool below(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return a < b || (a == b && std::signbit(a) && !std::signbit(b));
  } else {
    return a < b;
  }
}

// IEEE 754-2019's maximum and minimum of two floats (NaN if either is; -0 below +0) in one instruction, on
// sm_80 and newer GPUs: the same values as the tests below, but a NaN result is the canonical NaN, not the
// input's. H200, graph replay, against the compare-and-branch form (benchmarks/results/nvidia-h200/
// minmax_nan_instruction.md): bfloat16 amax over rows (4096, 4096) 26.9 -> 13.1 us, (2^24, 32) 477 -> 275,
// (64, 256, 56, 56) over (2, 3) 49.7 -> 29.7, whole 2^28 176 -> 123; float32 over rows of 1024 12.2 -> 10.1,
// (2^24, 32) 621 -> 512, 1.08-1.26x over other dims; float32 at the line (2^28, (2^27, 2)) unchanged.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define TORCH_REDUCE_NAN_MINMAX 1
__device__ __forceinline__ float nan_maximum(float a, float b) {
  float out;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(out) : "f"(a), "f"(b));
  return out;
}
__device__ __forceinline__ float nan_minimum(float a, float b) {
  float out;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(out) : "f"(a), "f"(b));
  return out;
}
#endif

// max/min propagate NaN like torch.amax/amin: `a != a` is true only for NaN (and is false for integers).
template <typename T>
struct MaxOp {
  static TR_HOST_DEVICE T identity() {
    return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                : std::numeric_limits<T>::lowest();
  }
  TR_HOST_DEVICE T operator()(T a, T b) const {
#if defined(TORCH_REDUCE_NAN_MINMAX)
    if constexpr (std::is_same_v<T, float>) return nan_maximum(a, b);
#endif
    return (a != a || below(b, a)) ? a : b;
  }
};

template <typename T>
struct MinOp {
  static TR_HOST_DEVICE T identity() {
    return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                : std::numeric_limits<T>::max();
  }
  TR_HOST_DEVICE T operator()(T a, T b) const {
#if defined(TORCH_REDUCE_NAN_MINMAX)
    if constexpr (std::is_same_v<T, float>) return nan_minimum(a, b);
#endif
    return (a != a || below(a, b)) ? a : b;
  }
};

// Whether a fold's result is the same bits in every order: max and min (they return one of the values, in a total
// order; NaN payloads aside) and integer sums and products (wrapping arithmetic is associative and commutative).
// The CPU backend folds these in whatever order vectorizes; a float sum follows the GPU's order (cpu/model.h).
template <typename Ops>
struct OrderFree {
  using T = decltype(Ops::identity());
  static constexpr bool value =
      std::is_base_of_v<MaxOp<T>, Ops> || std::is_base_of_v<MinOp<T>, Ops> ||
      (std::is_integral_v<T> && (std::is_same_v<Ops, SumOp<T>> || std::is_same_v<Ops, ProdOp<T>>));
};

// "No final map", as the ladder passes it to launch_device_reduce beside its combine operator.
struct KeepValue {
  template <typename T>
  TR_HOST_DEVICE T operator()(T v) const { return v; }
};

// A mean multiplies the sum by 1 / K, rounded once (torch's CUDA mean does the same; its CPU mean divides, which can
// differ in the last bit). A division's slow path is a call, and the row kernel holding it was compiled to 40
// registers (the sum's: 47) with two loads in flight a thread where the sum keeps three or four. H200, graph replay,
// divided -> multiplied: the mean over rows of (8192, 1024) 11.8 -> 10.2 us (the sum's 9.9), of (65536, 768) 52.2 ->
// 49.4.
template <typename T>
struct MeanOp : SumOp<T> {
  T factor;  // 1 / K; an empty mean is 0 * inf, NaN
  TR_HOST_DEVICE T project(T a) const { return a * factor; }
};

// Vector norms over floating T, as torch.linalg.vector_norm computes them: sum |x|^p, then ^(1/p), with
// the orders that need no power on their own ops (the power is most of the 78 instructions an element of order
// 1.5's whole-tensor kernel, Nsight Compute on the H200; the square root's kernel takes 13.5).
template <typename T>
struct NormZeroOp : SumOp<T> {  // the count of non-zeros (NaN counts)
  TR_HOST_DEVICE T transform(T x) const { return x == T(0) ? T(0) : T(1); }
};

template <typename T>
struct NormOneOp : SumOp<T> {
  TR_HOST_DEVICE T transform(T x) const { return std::fabs(x); }
};

template <typename T>
struct NormTwoOp : SumOp<T> {
  TR_HOST_DEVICE T transform(T x) const { return x * x; }
  TR_HOST_DEVICE T project(T a) const { return std::sqrt(a); }
};

template <typename T>
struct NormInfOp : MaxOp<T> {  // max |x|; NaN wins
  TR_HOST_DEVICE T transform(T x) const { return std::fabs(x); }
};

template <typename T>
struct NormNegInfOp : MinOp<T> {  // min |x|; NaN wins
  TR_HOST_DEVICE T transform(T x) const { return std::fabs(x); }
};

// p = 1/2: |x|^(1/2) is a square root, correctly rounded (pow's error is larger). H200, 2^28 float32, graph replay:
// 752 -> 260 us (31% -> 89% of the line; torch, with pow, 721).
template <typename T>
struct NormHalfOp : SumOp<T> {
  TR_HOST_DEVICE T transform(T x) const { return std::sqrt(std::fabs(x)); }
  TR_HOST_DEVICE T project(T a) const { return a * a; }
};

template <typename T>
struct NormPOp : SumOp<T> {  // any other p, negative, between 0 and 1, and NaN included
  T p;
  TR_HOST_DEVICE T transform(T x) const { return std::pow(std::fabs(x), p); }
  // p NaN: |x|^p is NaN or 1, so only an empty run sums to 0, and torch's empty norm is 0 (pow(0, NaN) is NaN).
  TR_HOST_DEVICE T project(T a) const { return p != p && a == T(0) ? a : std::pow(a, T(1) / p); }
};

// Calls f(ops) with the ops object of the vector norm of order `ord` over acc_t: the orders with their own ops
// object, then the power for any other.
template <typename acc_t, typename F>
decltype(auto) with_norm_ops(double ord, F&& f) {
  if (ord == 2) return f(NormTwoOp<acc_t>());
  if (ord == 1) return f(NormOneOp<acc_t>());
  if (ord == 0) return f(NormZeroOp<acc_t>());
  if (ord == 0.5) return f(NormHalfOp<acc_t>());
  if (std::isinf(ord)) return ord > 0 ? f(NormInfOp<acc_t>()) : f(NormNegInfOp<acc_t>());
  return f(NormPOp<acc_t>{{}, static_cast<acc_t>(ord)});
}

// Running statistics of a run of numbers: its mean, the sum of squared deviations from that mean (m2) and
// its length. Variance = m2 / (count - correction); m2 never subtracts two large squares (E[x^2]-E[x]^2).
template <typename T>
struct Welford {
  T mean, m2, count;
  Welford() = default;  // trivial, so it can live in __shared__ memory
  TR_HOST_DEVICE Welford(T mean_, T m2_, T count_) : mean(mean_), m2(m2_), count(count_) {}
  TR_HOST_DEVICE explicit Welford(T x) : mean(x), m2(T(0)), count(T(1)) {}  // one element
#if defined(__CUDACC__)
  // What block_reduce.cuh's shuffles use for accumulator structs: each field shuffled on its own.
  template <typename Shuffle>
  __device__ __forceinline__ static Welford shuffled(const Welford& v, Shuffle shuffle) {
    return Welford(shuffle(v.mean), shuffle(v.m2), shuffle(v.count));
  }
#endif
};

// Two sums carried through one reduction (one set of shuffles and barriers instead of two): LayerNorm's
// backward sums dy * weight and its product with xhat together.
template <typename T>
struct SumPair {
  T first, second;
  SumPair() = default;
  TR_HOST_DEVICE SumPair(T first_, T second_) : first(first_), second(second_) {}
#if defined(__CUDACC__)
  template <typename Shuffle>
  __device__ __forceinline__ static SumPair shuffled(const SumPair& v, Shuffle shuffle) {
    return SumPair(shuffle(v.first), shuffle(v.second));
  }
#endif
};

template <typename T>
struct SumPairOp {
  static TR_HOST_DEVICE SumPair<T> identity() { return SumPair<T>(T(0), T(0)); }
  TR_HOST_DEVICE SumPair<T> operator()(const SumPair<T>& a, const SumPair<T>& b) const {
    return SumPair<T>(a.first + b.first, a.second + b.second);
  }
};

// Chan et al.'s parallel combine of two runs' statistics; the empty run (count 0) is its identity.
template <typename T>
struct WelfordOp {
  static TR_HOST_DEVICE Welford<T> identity() { return Welford<T>(T(0), T(0), T(0)); }
  TR_HOST_DEVICE Welford<T> operator()(const Welford<T>& a, const Welford<T>& b) const {
    // An empty side returns the other unchanged (so an infinite mean is never multiplied by a zero share).
    if (b.count == T(0)) return a;
    if (a.count == T(0)) return b;
    const T count = a.count + b.count;
    // A run holding inf: its mean is inf (torch.mean's), the sum of the two means (their difference would be
    // inf - inf, NaN, for two infs of one sign or an inf beside finite values), NaN beside -inf; variance NaN.
    if (!std::isfinite(a.mean) || !std::isfinite(b.mean)) {
      return Welford<T>(a.mean + b.mean, std::numeric_limits<T>::quiet_NaN(), count);
    }
    const T b_share = b.count / count;
    const T delta = b.mean - a.mean;
    return Welford<T>(a.mean + delta * b_share, a.m2 + b.m2 + delta * delta * a.count * b_share, count);
  }
};

}  // namespace torch_reduce
