"""Import pagedserve's Triton kernels so that they run here: compiled on a CUDA machine, through Triton's
interpreter (TRITON_INTERPRET=1) on CPU.

Triton decides interpreter or compiler when a kernel is *defined* (at `@triton.jit`), so the variable
must be set before `pagedserve.kernels.triton` is imported. It is set only around that import and
removed again, so it never leaks into other tests or the processes they start (servers, workers):
those keep seeing the environment they had. The interpreted kernels stay in sys.modules, which is the
only way a CPU process can run them anyway.
"""

import contextlib
import importlib
import os
import sys
from types import ModuleType

import torch

KERNELS = "pagedserve.kernels.triton"
BACKEND = "pagedserve.attention.backends.triton"  # holds references to the kernels' functions
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def import_triton_kernels() -> ModuleType:
    if DEVICE.type == "cuda":
        return importlib.import_module(KERNELS)
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        if KERNELS in sys.modules and not sys.modules[KERNELS].INTERPRETED:  # defined for a GPU: redefine
            for name in [n for n in sys.modules if n.startswith((KERNELS, BACKEND))]:
                del sys.modules[name]
        # NOTE: triton imports gluon lazily at the first launch and asserts the interpreter mode then:
        # import it now, while the variable is set.
        with contextlib.suppress(ImportError):  # older triton has no gluon
            importlib.import_module("triton.experimental.gluon")
        return importlib.import_module(KERNELS)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous
