"""Pure-Python models of how the reduction kernels use the GPU, runnable without building torch_reduce._C.

Nothing here imports torch or the compiled extension: the models answer "what should the hardware do" from
addresses and the kernels' index arithmetic alone, so they can be checked on any machine and then compared
with Nsight Compute counters on a GPU.
"""
from . import banks
