// The dim reductions (dim_reduce.h's table) on the CPU: the reference path. Plain loops over the normal form
// in the accumulate type, outputs in parallel, in runs of 64 terms in sequence a value (8 lanes of a 512-element
// row run; 64 rows of a slab) whose results fold pairwise (lanes.h: PairwiseFold), so a float sum's rounding
// error grows with log2 of the reduced length, as torch's cascade sum's, not with the length; a whole-tensor
// reduction uses the CPU model of the GPU's single-pass kernel (cpu/model.h), whose tree does the same, unless its
// order does not matter.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "common/dispatch.h"
#include "cpu/isa.h"
#include "cpu/lanes.h"
#include "cpu/model.h"
#include "dim_reduce.h"
#include "ladder.h"

namespace torch_reduce::cpu {
namespace {

constexpr int64_t kModelBlock = 256;

// Elements a task folds at least when one fold is split over threads.
constexpr int64_t kChunk = 1 << 16;


// x[0, n), loaded, in lanes.
template <typename acc_t, typename scalar_t, typename Ops>
acc_t fold_run(const scalar_t* x, int64_t n, const Ops& ops) {
  const auto term = [&](int64_t j) { return load_element<acc_t>(ops, x[j]); };
  if constexpr (kKeyedExtreme<acc_t, Ops>) {
    return keyed_extreme<acc_t, Ops>(n, term);
  } else {
    return lane_fold<acc_t>(n, ops, term);
  }
}

// The whole tensor: an order-free fold (reduce_ops.h: OrderFree) in lanes, in parallel chunks; any other through
// the model's tree (the GPU's bits, a float sum's rounding error at O(log n)). The model loads elements without
// a transform, so an ops object that has one (a norm) is applied to every element first and the model folds
// those values.
template <typename acc_t, typename scalar_t, typename Ops>
acc_t reduce_whole(const scalar_t* in, int64_t n, const Ops& ops) {
  if constexpr (OrderFree<Ops>::value) {
    std::vector<acc_t> parts((n + kChunk - 1) / kChunk);
    parallel_for_best_vectors(0, static_cast<int64_t>(parts.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        parts[c] = fold_run<acc_t>(in + c * kChunk, std::min(kChunk, n - c * kChunk), ops);
      }
    });
    return lane_fold<acc_t>(static_cast<int64_t>(parts.size()), ops, [&](int64_t c) { return parts[c]; });
  } else if constexpr (HasTransform<Ops>::value) {
    std::vector<acc_t> loaded(n);
    parallel_for_best_vectors(0, n, kChunk, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) loaded[i] = load_element<acc_t>(ops, in[i]);
    });
    return device_reduce<acc_t>(loaded.data(), n, kModelBlock, kModelGpu, true, partials_ops(ops));
  } else {
    return device_reduce<acc_t>(in, n, kModelBlock, kModelGpu, true, ops);
  }
}

void launch_cpu(const ReduceKind& kind, const ReduceProblem& p, const at::Tensor& out) {
  TORCH_REDUCE_DISPATCH_DIM(p.input.scalar_type(), "torch_reduce dim reduction", [&] {
    with_stage_ops<scalar_t>(kind, [&](auto ops, auto out_type, auto) {
      using Ops = decltype(ops);
      using acc_t = ops_acc_t<Ops>;
      using out_t = typename decltype(out_type)::type;
      const scalar_t* in = p.input.const_data_ptr<scalar_t>();
      out_t* result = out.mutable_data_ptr<out_t>();
      const int64_t K = p.reduced, N = p.inner;
      if (p.outer * N == 1) {
        *result = static_cast<out_t>(project_result(ops, reduce_whole<acc_t>(in, K, ops)));
        return;
      }
      // One (b) slab at a time: a row (N = 1) in lanes, but for a product (the order decides where its partial
      // products over- or underflow, and the serial one is the reference's); else the N running values of a slab
      // walk its K rows in order, vectorized across n. A fold whose order matters takes its terms in runs, their
      // results folded pairwise; a product's run is the whole slab.
      constexpr bool kInRuns = !OrderFree<Ops>::value;
      constexpr bool kProduct = std::is_same_v<Ops, ProdOp<acc_t>>;
      parallel_for_best_vectors(0, p.outer, 1, [&](int64_t begin, int64_t end) {
        if (N == 1 && !kProduct) {
          for (int64_t b = begin; b < end; ++b) {
            const scalar_t* row = in + b * K;
            acc_t acc;
            if constexpr (kInRuns) {
              acc = pairwise_lane_fold<acc_t>(K, ops, [&](int64_t j) { return load_element<acc_t>(ops, row[j]); });
            } else {
              acc = fold_run<acc_t>(row, K, ops);
            }
            result[b] = static_cast<out_t>(project_result(ops, acc));
          }
          return;
        }
        if constexpr (kKeyedExtreme<acc_t, Ops>) {
          // Max and min as keys, so the walk across n vectorizes (lanes.h); a column with a NaN gives its first.
          using Keys = ExtremeKeys<Ops>;
          std::vector<int32_t> keys(N), nan(N);
          for (int64_t b = begin; b < end; ++b) {
            std::fill(keys.begin(), keys.end(), Keys::key(Ops::identity()));
            std::fill(nan.begin(), nan.end(), 0);
            const scalar_t* slab = in + b * K * N;
            for (int64_t k = 0; k < K; ++k) {
              for (int64_t n = 0; n < N; ++n) {
                const float v = load_element<acc_t>(ops, slab[k * N + n]);
                keys[n] = Keys::larger(Keys::key(v), keys[n]);
                nan[n] |= v != v;
              }
            }
            for (int64_t n = 0; n < N; ++n) {
              acc_t v = Keys::value(keys[n]);
              for (int64_t k = 0; nan[n] != 0; ++k) {  // the column's first NaN
                v = load_element<acc_t>(ops, slab[k * N + n]);
                if (v != v) break;
              }
              result[b * N + n] = static_cast<out_t>(project_result(ops, v));
            }
          }
          return;
        }
        const int64_t run_rows = kInRuns && !kProduct ? kRunTerms : std::max<int64_t>(K, 1);
        PairwiseFold<acc_t, Ops> tree(ops, N);
        for (int64_t b = begin; b < end; ++b) {
          const scalar_t* slab = in + b * K * N;
          tree.reset();
          for (int64_t k0 = 0; k0 < K; k0 += run_rows) {
            acc_t* __restrict acc = tree.run();
            std::fill(acc, acc + N, Ops::identity());
            const scalar_t* __restrict rows = slab + k0 * N;
            const int64_t run_end = std::min(K - k0, run_rows) * N;
            for (int64_t k = 0; k < run_end; k += N)
              for (int64_t n = 0; n < N; ++n) acc[n] = ops(acc[n], load_element<acc_t>(ops, rows[k + n]));
            tree.push();
          }
          const acc_t* acc = tree.finish();
          for (int64_t n = 0; n < N; ++n) result[b * N + n] = static_cast<out_t>(project_result(ops, acc[n]));
        }
      });
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CPU, m) { impl_dim_reductions<&launch_cpu>(m); }

}  // namespace torch_reduce::cpu
