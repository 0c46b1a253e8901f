// `import torch_reduce._C` loads the shared library, whose static initialisers register the ops.
#include <Python.h>

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "torch_reduce's compiled ops (torch.ops.reduce)", -1,
                               nullptr};
  return PyModule_Create(&module);
}
