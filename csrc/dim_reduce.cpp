#include "dim_reduce.h"

#include <ATen/DeviceGuard.h>
#include <ATen/WrapDimUtilsMulti.h>

#include <algorithm>
#include <bitset>
#include <limits>
#include <numeric>
#include <vector>

namespace torch_reduce {
namespace {

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::Sum: return "sum";
    case Reduction::Mean: return "mean";
    case Reduction::Amax: return "amax";
    default: return "amin";
  }
}

// The dtype the op returns, with torch's rules and messages.
at::ScalarType result_type(Reduction r, at::ScalarType input, std::optional<at::ScalarType> dtype) {
  switch (r) {
    case Reduction::Sum: return dtype.value_or(sum_result_type(input));
    case Reduction::Mean: {
      const at::ScalarType t = dtype.value_or(input);
      TORCH_CHECK(at::isFloatingType(t), "mean(): could not infer output dtype. ",
                  dtype ? "Optional dtype" : "Input dtype", " must be either a floating point or complex dtype. Got: ",
                  t);
      return t;
    }
    default: return input;
  }
}

// The normal form plus where each output lands: `kept_order` lists the kept dims of size > 1 in the
// order the kernel writes them (outermost first).
struct Layout {
  ReduceProblem problem;
  std::vector<int64_t> kept_order;
};

// Without copying when the input is dense: its dims in memory order (size-1 dims dropped), runs of
// reduced or kept dims merged; usable when at most one run is reduced. Else (interleaved reduced dims,
// gaps such as x[::2]) the reduced dims are permuted last and copied: (kept, reduced, 1).
Layout normal_form(const at::Tensor& x, const std::bitset<at::dim_bitset_size>& reduce_mask) {
  const int64_t ndim = x.dim();
  Layout layout;
  if (x.is_non_overlapping_and_dense()) {
    std::vector<int64_t> order;
    for (int64_t d = 0; d < ndim; ++d)
      if (x.size(d) > 1) order.push_back(d);
    // Dims of size > 1 of a dense tensor have distinct strides: descending stride is memory order.
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x.stride(a) > x.stride(b); });
    std::vector<std::pair<bool, int64_t>> runs;  // (reduced?, product of sizes)
    for (int64_t d : order) {
      const bool reduced = reduce_mask[d];
      if (!runs.empty() && runs.back().first == reduced) runs.back().second *= x.size(d);
      else runs.emplace_back(reduced, x.size(d));
      if (!reduced) layout.kept_order.push_back(d);
    }
    const auto reduced_runs = std::count_if(runs.begin(), runs.end(), [](const auto& run) { return run.first; });
    if (reduced_runs <= 1) {
      int64_t outer = 1, reduced = 1, inner = 1;
      bool after_reduced = false;
      for (const auto& [is_reduced, size] : runs) {
        if (is_reduced) reduced = size, after_reduced = true;
        else (after_reduced ? inner : outer) *= size;
      }
      layout.problem = {x.as_strided({x.numel()}, {1}), outer, reduced, inner};
      return layout;
    }
    layout.kept_order.clear();
  }
  std::vector<int64_t> permutation;
  int64_t outer = 1;
  for (int64_t d = 0; d < ndim; ++d)
    if (!reduce_mask[d]) {
      permutation.push_back(d);
      outer *= x.size(d);
      if (x.size(d) > 1) layout.kept_order.push_back(d);
    }
  for (int64_t d = 0; d < ndim; ++d)
    if (reduce_mask[d]) permutation.push_back(d);
  layout.problem = {x.permute(permutation).contiguous().view(-1), outer, x.numel() / std::max<int64_t>(outer, 1), 1};
  return layout;
}

}  // namespace

at::Tensor reduce_dims(Reduction r, const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                       std::optional<at::ScalarType> dtype, ReduceLauncher launch) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  const char* name = reduction_name(r);
  check_reducible_dtype(self, name);
  const at::ScalarType out_type = result_type(r, self.scalar_type(), dtype);
  // dtype= casts the input first (as torch does), so the sum runs in the accumulate type of that dtype.
  // Without it the kernels read the input as it is: an integer sum accumulates in int64 anyway.
  const at::Tensor x = dtype.has_value() && *dtype != self.scalar_type() ? self.to(*dtype) : self;
  check_reducible_dtype(x, name);

  const int64_t ndim = x.dim();
  const bool all_dims = !dim.has_value() || dim->empty();  // torch: dim=None and dim=() both mean every dim
  // torch checks an empty amax/amin's dims for size 0 first, before repeats.
  if ((r == Reduction::Amax || r == Reduction::Amin) && x.numel() == 0) {
    TORCH_CHECK(!all_dims, name, "(): Expected reduction dim to be specified for input.numel() == 0. ",
                "Specify the reduction dim with the 'dim' argument.");
    for (int64_t d : *dim) {
      d = at::maybe_wrap_dim(d, ndim);
      TORCH_CHECK_INDEX(x.size(d) != 0, name, "(): Expected reduction dim ", d, " to have non-zero size.");
    }
  }
  std::bitset<at::dim_bitset_size> reduce_mask;
  if (all_dims) reduce_mask.set();
  else reduce_mask = at::dim_list_to_bitset(*dim, ndim);  // wraps negative dims; raises on repeats and range

  std::vector<int64_t> out_shape;
  int64_t reduced_count = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    if (!reduce_mask[d]) out_shape.push_back(x.size(d));
    else {
      reduced_count *= x.size(d);
      if (keepdim) out_shape.push_back(1);
    }
  }
  const auto out_options = x.options().dtype(out_type);
  const int64_t outputs = c10::multiply_integers(out_shape);
  if (outputs == 0) return at::empty(out_shape, out_options);
  if (reduced_count == 0) {  // an empty sum is 0, an empty mean 0/0
    return at::full(out_shape, r == Reduction::Mean ? std::numeric_limits<double>::quiet_NaN() : 0.0, out_options);
  }

  const Layout layout = normal_form(x, reduce_mask);
  at::Tensor out = at::empty({outputs}, x.options().dtype(kernel_result_type(r, x.scalar_type())));
  launch(r, layout.problem, out);

  // The kernel wrote the kept dims in layout.kept_order; return them in the input's order, contiguous
  // (a copy only when that order differs, e.g. a permuted input keeping several dims).
  at::Tensor result = out.view(out_shape);
  if (!std::is_sorted(layout.kept_order.begin(), layout.kept_order.end())) {
    std::vector<int64_t> written_sizes;
    for (int64_t d : layout.kept_order) written_sizes.push_back(x.size(d));
    std::vector<int64_t> by_dim(layout.kept_order.size());
    std::iota(by_dim.begin(), by_dim.end(), 0);
    std::sort(by_dim.begin(), by_dim.end(),
              [&](int64_t a, int64_t b) { return layout.kept_order[a] < layout.kept_order[b]; });
    result = out.view(written_sizes).permute(by_dim).contiguous().view(out_shape);
  }
  return result.scalar_type() == out_type ? result : result.to(out_type);
}

}  // namespace torch_reduce
