// `import torch_reduce._C` loads the shared library, whose static initialisers register the ops; the module
// itself holds the drop-ins' C entry points (fast_call.cpp).
#include <Python.h>

namespace torch_reduce {
PyMethodDef* fast_call_methods();
}

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "torch_reduce's compiled ops (torch.ops.reduce)", -1,
                               torch_reduce::fast_call_methods()};
  return PyModule_Create(&module);
}
