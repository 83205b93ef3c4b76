"""Import pagedserve's Triton kernels so that they run here: compiled on a CUDA machine, through Triton's
interpreter (TRITON_INTERPRET=1) on CPU.

Triton decides interpreter or compiler when a kernel is *defined* (at `@triton.jit`), so the variable
must be set before `pagedserve.kernels.triton` is imported. It is set only around that import and
removed again, so it never leaks into other tests or the processes they start (servers, workers):
those keep seeing the environment they had. The interpreted kernels stay in sys.modules, which is the
only way a CPU process can run them anyway.

The interpreter re-patches `triton.language` at every call of a device function inside a kernel, a few
hundred `inspect.getmembers` each time, though the kernel's launch patched it already and restores it
when the grid is done: about a fifth of an interpreted quantized matmul. `_patch_language_once_per_launch`
makes those nested patches no-ops; the kernels run the same interpreted operations.
"""

import contextlib
import importlib
import os
import sys
from types import ModuleType
from typing import Any

import torch

KERNELS = "pagedserve.kernels.triton"
BACKEND = "pagedserve.attention.backends.triton"  # holds references to the kernels' functions
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class _NoPatches:
    """What a device function's call inside a launch gets instead of a second patch scope."""

    def restore(self) -> None:
        pass


def _patch_language_once_per_launch() -> None:
    """Inside a launch, a device function's call patches the language only the first time its module's
    names are seen: the patches stay until the launch's grid is done (those of the launch) or for good
    (the nested ones, as the interpreter leaves them). Left as it is where the interpreter's internals
    are not the ones this knows (`_patch_lang`, `GridExecutor.__call__`)."""
    from triton.runtime import interpreter

    patch, executor = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "GridExecutor", None)
    launch = getattr(executor, "__call__", None)  # noqa: B004 (the class's method, not whether it is callable)
    if patch is None or launch is None or getattr(launch, "patches_once", False):
        return
    seen: set[int] | None = None  # the ids of the globals of the functions patched for in this launch

    def patch_once(fn: Any) -> object:
        if seen is None:  # a device function called outside a launch
            return patch(fn)
        if id(fn.__globals__) in seen:
            return _NoPatches()
        seen.add(id(fn.__globals__))
        return patch(fn)

    def launch_patching_once(self: object, *args: object, **kwargs: object) -> object:
        nonlocal seen
        seen = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            seen = None

    launch_patching_once.patches_once = True  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch_patching_once


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
        kernels = importlib.import_module(KERNELS)
        _patch_language_once_per_launch()  # NOTE: after triton's import, which must see the variable
        return kernels
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous
