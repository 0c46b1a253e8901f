#pragma once
// A fold in kLanes independent accumulators: element j goes into lane j % kLanes and the lanes are folded
// pairwise at the end. The lanes' combines overlap (a sum's vectorize), where a single running value waits on
// every combine (a float add's latency an element), and a float sum's error grows with n / kLanes + log2(kLanes),
// not n.
#include <cstdint>

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

}  // namespace torch_reduce::cpu
