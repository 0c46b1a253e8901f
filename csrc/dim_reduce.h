#pragma once
// The dim reductions (torch.sum / mean / amax / amin / prod / linalg.vector_norm) with torch's semantics, shared
// by the CPU and CUDA kernels: one table of ops, the argument rules (dims, keepdim, dtype=, empty inputs,
// errors) and the layout, normalised to (outer B, reduced K, inner N) over one dense run of memory:
// out[b, n] = reduce over k of in[(b * K + k) * N + n]. Each backend supplies only a launcher for that
// normal form; docs/adding-an-op.md walks through adding a row.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <type_traits>

#include "common/dispatch.h"
#include "common/reduce_ops.h"

namespace torch_reduce {

// ---------------------------------------------------------------------------------------- the table ----
// One row per op: X(name, Reduction, Signature). From it come the schema (ops.cpp), the CPU and CUDA kernels
// (impl_dim_reductions below), the autograd kernel (dim_reduce_autograd.cpp); torch_reduce/ops.py holds the
// Python mirror (fake kernels and wrappers). What a row's Reduction computes is its ops object
// (with_reduce_ops), its rules (dim_reduce.cpp: result dtype, empty input) and its gradient
// (dim_reduce_autograd.cpp) and aten formula (composite.cpp).
#define TORCH_REDUCE_DIM_REDUCTIONS(X)    \
  X(sum, Sum, DimsDtype)                  \
  X(mean, Mean, DimsDtype)                \
  X(amax, Amax, Dims)                     \
  X(amin, Amin, Dims)                     \
  X(prod, Prod, DimsDtype)                \
  X(vector_norm, VectorNorm, OrdDimsDtype)

enum class Reduction { Sum, Mean, Amax, Amin, Prod, VectorNorm };

const char* reduction_name(Reduction r);

// linalg.vector_norm's input and dtype= rules, in torch's words (the norm ops and foreach_norm's).
void check_vector_norm_dtypes(at::ScalarType input, std::optional<at::ScalarType> dtype);

// One call's arguments, whatever the op's signature: views of the caller's, valid during the call.
// dim: nullopt or empty means every dim; ord: vector_norm's order (unused by the others).
struct ReduceCall {
  at::OptionalIntArrayRef dim;
  bool keepdim;
  std::optional<at::ScalarType> dtype;
  double ord;
};

// The table's signatures: the schema's arguments, the C++ function type, and the conversions between a
// call of that type and a ReduceCall. `bind<Body>` is a kernel of the op's type calling Body::run.
struct DimsDtype {  // sum, mean, prod
  static constexpr const char* kSchema =
      "(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor";
  using Fn = at::Tensor(const at::Tensor&, at::OptionalIntArrayRef, bool, std::optional<at::ScalarType>);
  template <typename Body>
  static at::Tensor bind(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                         std::optional<at::ScalarType> dtype) {
    return Body::run(self, ReduceCall{dim, keepdim, dtype, 0.0});
  }
  static at::Tensor call(const c10::TypedOperatorHandle<Fn>& op, const at::Tensor& self, const ReduceCall& c) {
    return op.call(self, c.dim, c.keepdim, c.dtype);
  }
};

struct Dims {  // amax, amin: dim=[] means every dim, no dtype=
  static constexpr const char* kSchema = "(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor";
  using Fn = at::Tensor(const at::Tensor&, at::IntArrayRef, bool);
  template <typename Body>
  static at::Tensor bind(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
    return Body::run(self, ReduceCall{dim, keepdim, std::nullopt, 0.0});
  }
  static at::Tensor call(const c10::TypedOperatorHandle<Fn>& op, const at::Tensor& self, const ReduceCall& c) {
    return op.call(self, c.dim.value_or(at::IntArrayRef()), c.keepdim);
  }
};

struct OrdDimsDtype {  // vector_norm, as torch.linalg.vector_norm
  static constexpr const char* kSchema =
      "(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor";
  using Fn = at::Tensor(const at::Tensor&, const at::Scalar&, at::OptionalIntArrayRef, bool,
                        std::optional<at::ScalarType>);
  template <typename Body>
  static at::Tensor bind(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dim, bool keepdim,
                         std::optional<at::ScalarType> dtype) {
    return Body::run(self, ReduceCall{dim, keepdim, dtype, ord.toDouble()});
  }
  static at::Tensor call(const c10::TypedOperatorHandle<Fn>& op, const at::Tensor& self, const ReduceCall& c) {
    return op.call(self, at::Scalar(c.ord), c.dim, c.keepdim, c.dtype);
  }
};

// A row's registered op, typed by its signature (looked up once).
template <Reduction R, typename Signature>
const c10::TypedOperatorHandle<typename Signature::Fn>& dim_reduction_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow((std::string("reduce::") + reduction_name(R)).c_str(), "")
                             .typed<typename Signature::Fn>();
  return op;
}

// ----------------------------------------------------------------------------------- the kernels' side ----

struct ReduceProblem {
  at::Tensor input;  // a contiguous 1-D view of the B * K * N elements, in the normal form's order
  int64_t outer;     // B
  int64_t reduced;   // K
  int64_t inner;     // N
};

// Which launch of a reduction: Whole, the only one; or a stage of a reduction whose reduced dims lie apart in
// memory (NCHW over (0, 2, 3): BatchNorm's statistics), read in place one reduced run at a time instead of
// copied: First folds elements into accumulators (the ops' transform, no project), Middle folds
// accumulators, Last folds them and projects. Stages write the accumulate type (accumulate_type), so their
// inputs after the first are float, double, int64 or uint64.
enum class Stage { Whole, First, Middle, Last };

// What the launcher is asked to compute: the row's reduction, its parameter (vector_norm's ord), the count
// of elements each output folds over all stages (mean's divisor), and the stage.
struct ReduceKind {
  Reduction reduction;
  double ord;
  int64_t count;
  Stage stage;
};

// What a reduction accumulates a scalar_t in: acc_type (common/dispatch.h), except that prod multiplies
// float32 in float64. In float32, (1 + a)(1 + b) = 1 + (a + b) + ab of two factors near 1 rounds only its
// small term ab, most often under half an ulp: the rounding is biased down (-0.02 ulp a product), and the
// lowest levels of a tree are all such products, so 2^22 factors 1 +- 0.001 drifted 3.6e-3 from the exact
// product (torch: 1e-5 - 1.2e-4). In float64 a product of two floats is exact and the rest stays far below
// float32's last bit: the exact product rounded once, in any fold order. The whole-tensor kernel keeps its 32
// registers (sm_90), so full occupancy and the grid the CPU model replays. 16-bit inputs keep float32, torch's
// accumulate type for them: their float64 fold takes 37-38 registers, fewer blocks than the model's grid.
template <typename scalar_t>
using prod_acc_t = std::conditional_t<std::is_same_v<scalar_t, float>, double, acc_type<scalar_t>>;

// The accumulate type of an ops object (its identity's type).
template <typename Ops>
using ops_acc_t = std::decay_t<decltype(Ops::identity())>;

// The dtype of a reduction's accumulate type: a split reduction's intermediates.
inline at::ScalarType accumulate_type(Reduction r, at::ScalarType t) {
  if (t == at::kDouble || t == at::kUInt64) return t;
  if (!at::isFloatingType(t)) return at::kLong;
  return r == Reduction::Prod && t == at::kFloat ? at::kDouble : at::kFloat;
}

// Writes the reduction of `problem` into `out`: B * N contiguous elements of kernel_result_type().
using ReduceLauncher = void (*)(const ReduceKind&, const ReduceProblem& problem, const at::Tensor& out);

// sum and prod of integers and bool widen to int64, their accumulate type (a requested narrower integer
// dtype is a cast of that afterwards); everything else is written in the input's dtype.
inline bool widens_integers(Reduction r) { return r == Reduction::Sum || r == Reduction::Prod; }

inline at::ScalarType kernel_result_type(Reduction r, at::ScalarType input) {
  return widens_integers(r) ? sum_result_type(input) : input;
}

// Raises for a dtype the row does not take: with torch's exception type and words where torch refuses it too.
void check_dim_reduction_dtype(Reduction r, at::ScalarType type);
// amax or amin of a complex dtype, which check_dim_reduction_dtype refuses, but only after torch's other checks.
bool complex_extremum(Reduction r, at::ScalarType type);
// The input's dtype as an op reads it: sum, mean and prod cast it to dtype= first, as torch's do, so they take any
// input torch casts (float8, complex32: torch.sum(x, dtype=torch.float32)), and dtype itself is checked where the
// kernels read it; a complex amax/amin raises later (complex_extremum).
void check_reduction_input(Reduction r, at::ScalarType input, std::optional<at::ScalarType> dtype);

// The registered ops' bodies: checks, then `launch` on the normal form (or a shortcut for empty inputs),
// with the input's device current.
at::Tensor reduce_dims(Reduction r, const at::Tensor& self, const ReduceCall& call, ReduceLauncher launch);

template <Reduction R, ReduceLauncher kLaunch>
struct KernelBody {
  static at::Tensor run(const at::Tensor& self, const ReduceCall& call) { return reduce_dims(R, self, call, kLaunch); }
};

// Registers every row of the table for one backend (the TORCH_LIBRARY_IMPL of its dispatch key): the same
// bodies, each backend bringing only its launcher.
template <ReduceLauncher kLaunch>
void impl_dim_reductions(torch::Library& m) {
#define TORCH_REDUCE_IMPL(name, reduction, Signature) \
  m.impl(#name, &Signature::template bind<KernelBody<Reduction::reduction, kLaunch>>);
  TORCH_REDUCE_DIM_REDUCTIONS(TORCH_REDUCE_IMPL)
#undef TORCH_REDUCE_IMPL
}

// The kernel's output element type for dtype scalar_t and ops object Ops: what kernel_result_type says.
template <typename scalar_t, typename Ops>
using kernel_out_t = std::conditional_t<!std::is_floating_point_v<acc_type<scalar_t>> &&
                                            (std::is_same_v<Ops, SumOp<acc_type<scalar_t>>> ||
                                             std::is_same_v<Ops, ProdOp<acc_type<scalar_t>>>),
                                        int64_t, scalar_t>;

// Calls f(ops) with the ops object of `kind` over acc_type<scalar_t> (prod: prod_acc_t); mean multiplies by
// 1 / kind.count. mean and the norms are only reached for floating inputs (reduce_dims checks). kPartials: the
// input is a split reduction's partials, already in the accumulate type, which the ops fold in (a 16-bit
// prod's float32 partials stay float32; a float32 prod's partials are float64 already).
template <typename scalar_t, bool kPartials = false, typename F>
void with_reduce_ops(const ReduceKind& kind, F&& f) {
  using acc_t = acc_type<scalar_t>;
  switch (kind.reduction) {
    case Reduction::Sum: return f(SumOp<acc_t>());
    case Reduction::Amax: return f(MaxOp<acc_t>());
    case Reduction::Amin: return f(MinOp<acc_t>());
    case Reduction::Prod:
      if constexpr (kPartials) {
        return f(ProdOp<acc_t>());
      } else {
        return f(ProdOp<prod_acc_t<scalar_t>>());
      }
    case Reduction::Mean:
    case Reduction::VectorNorm:
      if constexpr (std::is_floating_point_v<acc_t>) {
        if (kind.reduction == Reduction::Mean) return f(MeanOp<acc_t>{{}, acc_t(1.0 / static_cast<double>(kind.count))});
        return with_norm_ops<acc_t>(kind.ord, f);
      }
      break;
  }
  TORCH_CHECK(false, "torch_reduce: ", reduction_name(kind.reduction), " of ", c10::CppTypeToScalarType<scalar_t>::value,
              " reached a kernel");
}

// Calls f(ops, TypeTag<out_t>(), whole) for one launch of `kind` on a scalar_t input: the ops object
// and output element type of its stage; whole (std::true_type for Stage::Whole alone) says whether the
// launch may be a whole-tensor reduction, so the stages do not instantiate those kernels (a split
// reduction keeps a dim). The later stages are instantiated only for the accumulate types they read.
template <typename T>
struct TypeTag {  // a type as a value (C++20's std::type_identity; torch 2.11 extensions build as C++17)
  using type = T;
};

template <typename scalar_t, typename F>
void with_stage_ops(const ReduceKind& kind, F&& f) {
  if (kind.stage == Stage::Whole || kind.stage == Stage::First) {
    return with_reduce_ops<scalar_t>(kind, [&](auto ops) {
      if (kind.stage == Stage::Whole) return f(ops, TypeTag<kernel_out_t<scalar_t, decltype(ops)>>(), std::true_type());
      return f(unprojected(ops), TypeTag<ops_acc_t<decltype(ops)>>(), std::false_type());
    });
  }
  with_reduce_ops<scalar_t, true>(kind, [&](auto ops) {
    using acc_t = ops_acc_t<decltype(ops)>;
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      auto fold = partials_ops(ops);  // not const: kernel_out_t compares the type
      if (kind.stage == Stage::Middle) return f(unprojected(fold), TypeTag<acc_t>(), std::false_type());
      return f(fold, TypeTag<kernel_out_t<scalar_t, decltype(fold)>>(), std::false_type());
    }
    TORCH_CHECK(false, "torch_reduce: a later stage of ", reduction_name(kind.reduction), " read ",
                c10::CppTypeToScalarType<scalar_t>::value, ", not its accumulate type");
  });
}

}  // namespace torch_reduce
