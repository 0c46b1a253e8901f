#pragma once
// The combine operators every reduction is built from, shared by the CPU and CUDA kernels.
// Each carries its identity, so a thread with nothing to load contributes a neutral value.
#include <cstdint>
#include <limits>

#if defined(__CUDACC__)
#define TR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TR_HOST_DEVICE inline
#endif

namespace torch_reduce {

template <typename T>
struct SumOp {
  static TR_HOST_DEVICE T identity() { return T(0); }
  TR_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
};

// max/min propagate NaN like torch.amax/amin: `a != a` is true only for NaN (and is false for integers).
template <typename T>
struct MaxOp {
  static TR_HOST_DEVICE T identity() {
    return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                : std::numeric_limits<T>::lowest();
  }
  TR_HOST_DEVICE T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};

template <typename T>
struct MinOp {
  static TR_HOST_DEVICE T identity() {
    return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                : std::numeric_limits<T>::max();
  }
  TR_HOST_DEVICE T operator()(T a, T b) const { return (a != a || a < b) ? a : b; }
};

// What the final value goes through before it is stored: nothing (sum, amax, amin) or a division (mean).
struct KeepValue {
  template <typename T>
  TR_HOST_DEVICE T operator()(T v) const { return v; }
};

template <typename T>
struct DivideBy {
  T count;
  TR_HOST_DEVICE T operator()(T v) const { return v / count; }
};

// Running statistics of a run of numbers: its mean, the sum of squared deviations from that mean (m2) and
// its length. Variance = m2 / (count - correction); m2 never subtracts two large squares (E[x^2]-E[x]^2).
template <typename T>
struct Welford {
  T mean, m2, count;
  Welford() = default;  // trivial, so it can live in __shared__ memory
  TR_HOST_DEVICE Welford(T mean_, T m2_, T count_) : mean(mean_), m2(m2_), count(count_) {}
  TR_HOST_DEVICE explicit Welford(T x) : mean(x), m2(T(0)), count(T(1)) {}  // one element
#if defined(__CUDACC__)
  // What block_reduce.cuh's shfl_down uses for accumulator structs: each field shuffled on its own.
  __device__ __forceinline__ static Welford shfl_down(const Welford& v, unsigned offset, unsigned width) {
    return Welford(__shfl_down_sync(0xffffffffu, v.mean, offset, width),
                   __shfl_down_sync(0xffffffffu, v.m2, offset, width),
                   __shfl_down_sync(0xffffffffu, v.count, offset, width));
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
  __device__ __forceinline__ static SumPair shfl_down(const SumPair& v, unsigned offset, unsigned width) {
    return SumPair(__shfl_down_sync(0xffffffffu, v.first, offset, width),
                   __shfl_down_sync(0xffffffffu, v.second, offset, width));
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
    const T b_share = b.count / count;
    const T delta = b.mean - a.mean;
    return Welford<T>(a.mean + delta * b_share, a.m2 + b.m2 + delta * delta * a.count * b_share, count);
  }
};

}  // namespace torch_reduce
