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

}  // namespace torch_reduce
