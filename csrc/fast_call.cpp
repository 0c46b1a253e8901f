// The drop-in reductions' Python entry points (torch_reduce.sum, mean, amax, amin, prod, vector_norm), in C:
// the common call (a plain tensor, dims as an int, a tuple or a list, keepdim, ord, no dtype= or out=) is parsed
// here and goes to the op's typed dispatcher handle, unboxed. torch.ops' boxed path costs about 2.5 us more a
// call than torch's own bindings (CPU tensors, 2 cores: torch.sum 2.0 us, the op through torch.ops 4.1 us,
// through its Python wrapper 5.7 us), which made every small reduction slower than torch's.
// Anything else takes the Python wrapper (torch_reduce/reductions.py), unchanged: tensor subclasses and
// __torch_function__ modes, dtype= and out=, unusual argument types, and every call that raised or warned (the
// wrapper runs it again, so its errors and warnings are the op's own, word for word). torch.compile traces the
// wrapper in its place (torch.compiler.substitute_in_graph, in reductions.py).
//
// Only Python's limited API is used, so _C stays abi3; two symbols come from libtorch_python, whose C++ ABI _C
// depends on anyway: THPVariable_Wrap, and the tensor object's layout (a PyObject header, then the at::Tensor).
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <optional>
#include <string>

#include "dim_reduce.h"

PyObject* THPVariable_Wrap(const at::TensorBase& var);  // libtorch_python

namespace torch_reduce {
namespace {

struct TensorObject {  // torch/csrc/autograd/python_variable.h's THPVariable, up to the field read here
  PyObject_HEAD
  at::Tensor cdata;
};

// Set once from Python (_C._fast_call_setup): the types read directly (torch.Tensor, nn.Parameter: neither has
// a __torch_function__ of its own) and each op's Python wrapper.
PyObject* plain_types = nullptr;
std::array<PyObject*, 6> wrappers{};

bool is_plain_tensor(PyObject* obj) {
  if (plain_types == nullptr) return false;
  const Py_ssize_t n = PyTuple_Size(plain_types);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (reinterpret_cast<PyObject*>(Py_TYPE(obj)) == PyTuple_GetItem(plain_types, i)) return true;
  return false;
}

// The Python wrapper, called with the caller's arguments as they came.
PyObject* call_wrapper(Reduction r, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* wrapper = wrappers[static_cast<size_t>(r)];
  if (wrapper == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "torch_reduce._C: the reductions' Python wrappers are not set");
    return nullptr;
  }
  PyObject* positional = PyTuple_New(nargs);
  if (positional == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    Py_INCREF(args[i]);
    PyTuple_SetItem(positional, i, args[i]);
  }
  PyObject* keywords = nullptr;
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_Size(kwnames);
  if (nkw > 0) {
    keywords = PyDict_New();
    for (Py_ssize_t i = 0; keywords != nullptr && i < nkw; ++i) {
      if (PyDict_SetItem(keywords, PyTuple_GetItem(kwnames, i), args[nargs + i]) != 0) Py_CLEAR(keywords);
    }
    if (keywords == nullptr) {
      Py_DECREF(positional);
      return nullptr;
    }
  }
  PyObject* result = PyObject_Call(wrapper, positional, keywords);
  Py_DECREF(positional);
  Py_XDECREF(keywords);
  return result;
}

// The signatures' Python parameters, positional first (names as the wrappers'), then keyword-only.
template <typename Signature>
struct Parameters;
template <>
struct Parameters<DimsDtype> {
  static constexpr std::array<const char*, 3> kPositional{"input", "dim", "keepdim"};
  static constexpr std::array<const char*, 2> kKeywordOnly{"dtype", "out"};
};
template <>
struct Parameters<Dims> {
  static constexpr std::array<const char*, 3> kPositional{"input", "dim", "keepdim"};
  static constexpr std::array<const char*, 1> kKeywordOnly{"out"};
};
template <>
struct Parameters<OrdDimsDtype> {
  static constexpr std::array<const char*, 4> kPositional{"x", "ord", "dim", "keepdim"};
  static constexpr std::array<const char*, 2> kKeywordOnly{"dtype", "out"};
};

bool is_exact_int(PyObject* obj) { return PyLong_CheckExact(obj); }  // not bool, not a numpy or tensor scalar

// dim as an int, a tuple or a list of ints, into dims; false for anything else (the wrapper decides).
bool parse_dims(PyObject* obj, c10::SmallVector<int64_t, 8>& dims) {
  if (is_exact_int(obj)) {
    const long long d = PyLong_AsLongLong(obj);
    if (d == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    dims.push_back(d);
    return true;
  }
  if (!PyTuple_CheckExact(obj) && !PyList_CheckExact(obj)) return false;
  const Py_ssize_t n = PySequence_Size(obj);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_CheckExact(obj) ? PyTuple_GetItem(obj, i) : PyList_GetItem(obj, i);
    if (item == nullptr || !is_exact_int(item)) {
      PyErr_Clear();
      return false;
    }
    const long long d = PyLong_AsLongLong(item);
    if (d == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    dims.push_back(d);
  }
  return true;
}

// Records whether the op warned: such a call is run again by the wrapper, which turns torch's warnings into
// Python's as torch's bindings do.
struct WarningSeen : c10::WarningHandler {
  bool seen = false;
  void process(const c10::Warning&) override { seen = true; }
};

template <Reduction R, typename Signature>
PyObject* fast_call(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  using P = Parameters<Signature>;
  constexpr size_t kPositional = P::kPositional.size(), kAll = kPositional + P::kKeywordOnly.size();
  const auto slow = [&] { return call_wrapper(R, args, nargs, kwnames); };
  if (nargs < 1 || static_cast<size_t>(nargs) > kPositional) return slow();
  std::array<PyObject*, kAll> slots{};
  for (Py_ssize_t i = 0; i < nargs; ++i) slots[i] = args[i];
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_Size(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* name = PyTuple_GetItem(kwnames, k);
    size_t at = kAll;
    for (size_t j = 1; j < kAll; ++j) {
      const char* want = j < kPositional ? P::kPositional[j] : P::kKeywordOnly[j - kPositional];
      if (PyUnicode_CompareWithASCIIString(name, want) == 0) at = j;
    }
    if (at == kAll || slots[at] != nullptr) return slow();  // unknown or repeated: the wrapper's TypeError
    slots[at] = args[nargs + k];
  }
  for (size_t j = kPositional; j < kAll; ++j)  // dtype= and out=: the wrapper's
    if (slots[j] != nullptr && slots[j] != Py_None) return slow();
  PyObject* input = slots[0];
  if (input == nullptr || !is_plain_tensor(input) || at::impl::torch_function_mode_enabled()) return slow();
  size_t next = 1;
  double ord = 2.0;
  if constexpr (std::is_same_v<Signature, OrdDimsDtype>) {
    PyObject* o = slots[next++];
    if (o != nullptr) {
      if (!is_exact_int(o) && !PyFloat_CheckExact(o)) return slow();
      ord = PyFloat_AsDouble(o);
      if (ord == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return slow();
      }
    }
  }
  PyObject* dim = slots[next++];
  PyObject* keepdim_obj = slots[next];
  c10::SmallVector<int64_t, 8> dims;
  const bool all_dims = dim == nullptr || dim == Py_None;
  if (!all_dims && !parse_dims(dim, dims)) return slow();
  if (keepdim_obj != nullptr && keepdim_obj != Py_True && keepdim_obj != Py_False) return slow();
  at::OptionalIntArrayRef dim_ref;
  if (!all_dims || std::is_same_v<Signature, Dims>) dim_ref = at::IntArrayRef(dims);  // amax(dim=None): every dim
  const ReduceCall call{dim_ref, keepdim_obj == Py_True, std::nullopt, ord};
  const at::Tensor& self = reinterpret_cast<TensorObject*>(input)->cdata;

  at::Tensor result;
  bool failed = false;
  WarningSeen warnings;
  PyThreadState* released = PyEval_SaveThread();
  try {
    const c10::WarningUtils::WarningHandlerGuard guard(&warnings);
    result = Signature::call(dim_reduction_op<R, Signature>(), self, call);
  } catch (...) {
    failed = true;
  }
  PyEval_RestoreThread(released);
  if (failed || warnings.seen) return slow();
  return THPVariable_Wrap(result);
}

PyMethodDef* methods();

// Each op's Python wrapper, and the entry point's docstring: the wrapper's signature and doc (read by help()
// and inspect.signature when asked, so it may be set after the module is made).
PyObject* fast_call_setup(PyObject*, PyObject* args) {
  PyObject *types = nullptr, *table = nullptr;
  if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &types, &PyDict_Type, &table)) return nullptr;
  static std::array<std::string, 6> docs;
  const auto set = [&](Reduction r, const char* name) {
    PyObject* entry = PyDict_GetItemString(table, name);  // borrowed: (wrapper, docstring)
    PyObject *fn = nullptr, *doc = nullptr;
    if (entry == nullptr || !PyArg_ParseTuple(entry, "OU", &fn, &doc)) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "no Python wrapper for %s", name);
      return false;
    }
    const char* text = PyUnicode_AsUTF8AndSize(doc, nullptr);
    if (text == nullptr) return false;
    const auto i = static_cast<size_t>(r);
    docs[i] = text;
    for (PyMethodDef* m = methods(); m->ml_name != nullptr; ++m)
      if (std::string(m->ml_name) == name) m->ml_doc = docs[i].c_str();
    Py_INCREF(fn);
    Py_XDECREF(wrappers[i]);
    wrappers[i] = fn;
    return true;
  };
#define TORCH_REDUCE_SET_WRAPPER(name, reduction, Signature) \
  if (!set(Reduction::reduction, #name)) return nullptr;
  TORCH_REDUCE_DIM_REDUCTIONS(TORCH_REDUCE_SET_WRAPPER)
#undef TORCH_REDUCE_SET_WRAPPER
  Py_INCREF(types);
  Py_XDECREF(plain_types);
  plain_types = types;
  Py_RETURN_NONE;
}

PyMethodDef* methods() {
#define TORCH_REDUCE_METHOD(name, reduction, Signature)                                                       \
  {#name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_call<Reduction::reduction, Signature>)), \
   METH_FASTCALL | METH_KEYWORDS, nullptr},
  static PyMethodDef table[] = {
      TORCH_REDUCE_DIM_REDUCTIONS(TORCH_REDUCE_METHOD)
      {"_fast_call_setup", &fast_call_setup, METH_VARARGS,
       "_fast_call_setup(plain_types, {name: (wrapper, docstring)}): the tensor types read directly, and each "
       "entry point's Python wrapper and docstring."},
      {nullptr, nullptr, 0, nullptr}};
#undef TORCH_REDUCE_METHOD
  return table;
}

}  // namespace

PyMethodDef* fast_call_methods() { return methods(); }

}  // namespace torch_reduce
