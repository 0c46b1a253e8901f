#pragma once
// A fold in kLanes independent accumulators: element j goes into lane j % kLanes and the lanes are folded
// pairwise at the end. The lanes' combines overlap (a sum's vectorize), where a single running value waits on
// every combine (a float add's latency an element), and a float sum's error grows with n / kLanes + log2(kLanes),
// not n.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/reduce_ops.h"

namespace torch_reduce::cpu {

constexpr int64_t kLanes = 8;

// ops over term(j) for j in [0, n), term(j) already in acc_t (loaded and transformed).
template <typename acc_t, typename Ops, typename Term>
acc_t lane_fold(int64_t n, const Ops& ops, Term term) {
  acc_t acc[kLanes];
  for (auto& a : acc) a = Ops::identity();
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) acc[k] = ops(acc[k], term(j + k));
  }
  for (; j < n; ++j) acc[j % kLanes] = ops(acc[j % kLanes], term(j));
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
    for (int64_t k = 0; k < width; ++k) acc[k] = ops(acc[k], acc[k + width]);
  }
  return acc[0];
}

// max and min (amax, amin, the inf norms) in float32, folded as integers: key(x) orders every float that is not
// NaN as below() does (-0 below +0), and its bitwise complement reverses that order, so a max or a min is an
// integer max of keys: compares and selects that vectorize, where MaxOp's NaN and signed-zero tests compiled to
// branches that random data mispredicts (GCC, one thread, amax of 2^18 floats: 190 us in lanes of MaxOp, 82-119 us
// keyed, torch 25-30 us with AVX2; this build targets baseline x86-64 vectors). The same bits as MaxOp / MinOp in any
// order; NaN is tracked on the side and wins, as there.
template <typename acc_t, typename Ops>
inline constexpr bool kKeyedExtreme =
    std::is_same_v<acc_t, float> && (std::is_base_of_v<MaxOp<float>, Ops> || std::is_base_of_v<MinOp<float>, Ops>);

template <typename Ops>
struct ExtremeKeys {
  static constexpr bool kMax = std::is_base_of_v<MaxOp<float>, Ops>;
  // Its own inverse: flips the 31 lower bits of a negative float.
  static int32_t flip(int32_t bits) { return bits ^ ((bits >> 31) & 0x7fffffff); }
  static int32_t key(float v) {
    int32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    return kMax ? flip(bits) : ~flip(bits);
  }
  static float value(int32_t key) {
    const int32_t bits = flip(kMax ? key : ~key);
    float v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
  static int32_t larger(int32_t a, int32_t b) { return a > b ? a : b; }
};

// ops over term(j) for j in [0, n), as lane_fold, for ops with kKeyedExtreme: one running key and one NaN flag,
// integer max and or reductions that the compiler vectorizes itself. A run holding a NaN gives its first NaN.
template <typename acc_t, typename Ops, typename Term>
acc_t keyed_extreme(int64_t n, Term term) {
  static_assert(kKeyedExtreme<acc_t, Ops>);
  using Keys = ExtremeKeys<Ops>;
  int32_t top = Keys::key(Ops::identity()), any_nan = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float v = term(j);
    top = Keys::larger(Keys::key(v), top);
    any_nan |= v != v;
  }
  if (any_nan) {
    for (int64_t i = 0;; ++i) {
      const float v = term(i);
      if (v != v) return v;
    }
  }
  return Keys::value(top);
}

}  // namespace torch_reduce::cpu
