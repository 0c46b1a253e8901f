#pragma once
// A fold in kLanes independent accumulators: element j goes into lane j % kLanes and the lanes are folded
// pairwise at the end. The lanes' combines overlap (a sum's vectorize), where a single running value waits on
// every combine (a float add's latency an element), and a float sum's error grows with n / kLanes + log2(kLanes),
// not n.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

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

// A pairwise tree over partial folds as they come, `width` independent ones at a time (a slab's columns, or one
// row): push() folds the new partials with the pushed ones of equal rank, as a binary counter carries, and finish()
// folds the ranks that remain, the newest first: a fixed order. A float sum of m partials so rounds about log2(m)
// times along any path, where a running value rounds m times (float32 rows of 8e6 tenths, summed in 8 lanes:
// 9.6e-3 off; in runs of 512 under this tree: 6.4e-7; torch's cascade sum: 5.6e-7).
template <typename acc_t, typename Ops, bool kOneWide = false>
class PairwiseFold {
  // One row's tree (kOneWide) lives in the object: no heap allocation a row. A slab's columns, in vectors.
  using Run = std::conditional_t<kOneWide, std::array<acc_t, 1>, std::vector<acc_t>>;
  using Ranks = std::conditional_t<kOneWide, std::array<acc_t, 64>, std::vector<acc_t>>;

 public:
  explicit PairwiseFold(const Ops& ops, int64_t width = 1) : width_(width), ops_(ops) {
    if constexpr (!kOneWide) run_.resize(static_cast<size_t>(width));
  }
  void reset() { count_ = 0; }
  // The next partials, filled in by the caller before push().
  acc_t* run() { return run_.data(); }
  void push() {
    int64_t rank = 0;
    for (; (count_ >> rank) & 1; ++rank) fold_into(run_.data(), rank);
    if constexpr (!kOneWide) {
      const int64_t needed = (rank + 1) * width_;
      if (static_cast<int64_t>(ranks_.size()) < needed) ranks_.resize(static_cast<size_t>(needed));
    }
    std::copy_n(run_.begin(), width_, ranks_.begin() + rank * width_);
    ++count_;
  }
  // Every pushed partial folded, in run() (the identity where none was pushed). With `newer`: those partials
  // folded onto it, as if it were the ranks below the lowest pushed one (a tree of the runs that came after).
  acc_t* finish(const acc_t* newer = nullptr) {
    bool first = newer == nullptr;
    if (first) {
      std::fill_n(run_.begin(), width_, Ops::identity());
    } else {
      std::copy_n(newer, width_, run_.begin());
    }
    for (int64_t rank = 0; (count_ >> rank) != 0; ++rank) {
      if (((count_ >> rank) & 1) == 0) continue;
      if (first) {
        std::copy_n(ranks_.begin() + rank * width_, width_, run_.begin());
      } else {
        fold_into(run_.data(), rank);
      }
      first = false;
    }
    return run_.data();
  }

 private:
  // acc = ops(rank's partials, acc): the older partials on the left.
  void fold_into(acc_t* acc, int64_t rank) const {
    const acc_t* older = ranks_.data() + rank * width_;
    for (int64_t n = 0; n < width_; ++n) acc[n] = ops_(older[n], acc[n]);
  }
  int64_t width_;
  Ops ops_;
  Run run_{};
  Ranks ranks_{};
  uint64_t count_ = 0;
};

// Terms a value takes in sequence before its run's result joins a PairwiseFold: a lane of a row's run, or a
// column of a slab's run of rows.
constexpr int64_t kRunTerms = 64;

// ops over term(j) for j in [0, n), as lane_fold, in runs of kRunTerms terms a lane folded pairwise: a float sum's
// rounding grows with log2(n), not n / kLanes.
template <typename acc_t, typename Ops, typename Term>
acc_t pairwise_lane_fold(int64_t n, const Ops& ops, Term term) {
  constexpr int64_t kRun = kRunTerms * kLanes;
  if (n <= kRun) return lane_fold<acc_t>(n, ops, term);
  PairwiseFold<acc_t, Ops, true> tree(ops);
  for (int64_t first = 0; first < n; first += kRun) {
    *tree.run() = lane_fold<acc_t>(std::min(kRun, n - first), ops, [&](int64_t j) { return term(first + j); });
    tree.push();
  }
  return *tree.finish();
}

// max and min (amax, amin, the inf norms) in float32 and float64, folded as integers of their width: key(x) orders
// every float that is not NaN as below() does (-0 below +0), and its bitwise complement reverses that order, so a
// max or a min is an integer max of keys: compares and selects that vectorize, where MaxOp's NaN and signed-zero
// tests compiled to branches that random data mispredicts (GCC, one thread, amax of 2^18 floats: 190 us in lanes of
// MaxOp, 82-119 us keyed, torch 25-30 us with AVX2; this build targets baseline x86-64 vectors). The same bits as
// MaxOp / MinOp in any order; NaN is tracked on the side and wins, as there.
template <typename acc_t, typename Ops>
inline constexpr bool kKeyedExtreme = (std::is_same_v<acc_t, float> || std::is_same_v<acc_t, double>) &&
                                      (std::is_base_of_v<MaxOp<acc_t>, Ops> || std::is_base_of_v<MinOp<acc_t>, Ops>);

template <typename acc_t, typename Ops>
struct ExtremeKeys {
  using key_t = std::conditional_t<sizeof(acc_t) == 4, int32_t, int64_t>;
  static constexpr bool kMax = std::is_base_of_v<MaxOp<acc_t>, Ops>;
  // Its own inverse: flips the lower bits (all but the sign) of a negative float.
  static key_t flip(key_t bits) {
    return bits ^ ((bits >> (sizeof(key_t) * 8 - 1)) & std::numeric_limits<key_t>::max());
  }
  static key_t key(acc_t v) {
    key_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    return kMax ? flip(bits) : ~flip(bits);
  }
  static acc_t value(key_t key) {
    const key_t bits = flip(kMax ? key : ~key);
    acc_t v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
  static key_t larger(key_t a, key_t b) { return a > b ? a : b; }
};

// step(state, j) for j in [0, n), over the two halves of the run at once, into two states (returned as {first,
// second}: the first half's, with the odd last element, and the second's): two dependency chains where one state
// made each step wait on the last. For folds whose order does not matter (max and min).
template <typename State, typename Step>
std::array<State, 2> fold_halves(int64_t n, State init, Step step) {
  std::array<State, 2> s{init, init};
  const int64_t half = n / 2;
  for (int64_t j = 0; j < half; ++j) {
    step(s[0], j);
    step(s[1], half + j);
  }
  if (n % 2 != 0) step(s[0], n - 1);
  return s;
}

// ops over term(j) for j in [0, n), as lane_fold, for ops with kKeyedExtreme: running keys and NaN flags, integer
// max and or reductions that the compiler vectorizes itself, in fold_halves' two chains (one thread, float64 amax of
// 2^18: 0.057 -> 0.041 ms with two, torch 0.025; float32 the same 0.021, torch 0.015; keys in lanes of 128 bytes
// instead ran slower, 2^21 0.46 -> 0.84 ms; a running float max, `v > top ? v : top` with a rescan for the sign of a
// zero result, compiled to a branch an element: 2^18 float32 0.021 -> 0.098 ms). A run holding a NaN gives its
// first NaN.
template <typename acc_t, typename Ops, typename Term>
acc_t keyed_extreme(int64_t n, Term term) {
  static_assert(kKeyedExtreme<acc_t, Ops>);
  using Keys = ExtremeKeys<acc_t, Ops>;
  // The flag as wide as the key: a vector's NaN mask is or-ed in as it is, not packed.
  struct State {
    typename Keys::key_t top, nan;
  };
  const auto s = fold_halves(n, State{Keys::key(Ops::identity()), 0}, [&](State& state, int64_t j) {
    const acc_t v = term(j);
    state.top = Keys::larger(Keys::key(v), state.top);
    state.nan |= v != v;
  });
  if (s[0].nan | s[1].nan) {
    for (int64_t i = 0;; ++i) {
      const acc_t v = term(i);
      if (v != v) return v;
    }
  }
  return Keys::value(Keys::larger(s[0].top, s[1].top));
}

}  // namespace torch_reduce::cpu
