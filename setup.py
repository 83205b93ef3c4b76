"""Compiles the native CPU kernels (pagedserve/kernels/cpu) at install, so that a first serve does not.

The metadata is pyproject.toml's; this file only adds the extension. It must link against the torch the
package will run with, the environment's own, hence `pip install --no-build-isolation -e .`. An isolated
build has no torch (and must never fetch one: Linux torch on PyPI is a multi-GB CUDA build), so it skips
the extension and the kernels compile on first use instead. A missing compiler or a failed build does not
fail the install either: the JIT build at first use then reports its own error.
"""

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
KERNELS = "pagedserve/kernels/cpu"  # setup() takes paths relative to this folder


def _load_build_config() -> Any:
    """kernels/cpu/build_config.py, by path: importing the package would need all of its dependencies."""
    spec = importlib.util.spec_from_file_location(
        "_pagedserve_build_config", ROOT / KERNELS / "build_config.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_config = _load_build_config()


def _skip(reason: str) -> None:
    print(
        f"pagedserve: not compiling the native CPU kernels at install ({reason}); they will compile on "
        f"first use instead. To compile them at install: {build_config.PREBUILD_COMMAND}",
        file=sys.stderr,
    )


class NoTorchNotice(build_py):  # type: ignore[misc]
    """Says, once per build, that the extension is skipped (setup.py itself runs several times)."""

    def run(self) -> None:
        _skip("torch is not importable in this build environment")
        super().run()


def _extension_setup() -> dict[str, Any]:
    """setup()'s ext_modules and cmdclass: the kernels' extension when torch is importable."""
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:  # an isolated build environment
        return {"cmdclass": {"build_py": NoTorchNotice}}

    class BuildKernels(BuildExtension):
        """BuildExtension with the JIT build's flags, that records what the library was built from beside
        it (build_config.BUILD_INFO) and turns a failure into a message."""

        def run(self) -> None:
            info = Path(self.get_ext_fullpath(build_config.EXTENSION)).with_name(build_config.BUILD_INFO.name)
            info.unlink(missing_ok=True)  # a record only ever describes a library that finished beside it
            try:
                super().run()
            except Exception as exc:  # noqa: BLE001 (the install goes on; the JIT build will say what fails)
                _skip(f"the build failed: {(str(exc).strip().splitlines() or [repr(exc)])[0]}")
                return
            info.write_text(json.dumps(build_config.build_record(), indent=1) + "\n")
            print(f"pagedserve: compiled the native CPU kernels at install ({info.parent})", file=sys.stderr)

        def build_extensions(self) -> None:
            compiler = build_config.cxx_compiler()
            if not build_config.compiler_accepts(compiler, []):
                raise RuntimeError(f"no working C++ compiler (${{CXX:-c++}} is {compiler!r})")
            # NOTE: setuptools starts each compile line with Python's own CFLAGS (-g -fwrapv -Wall ...);
            # the JIT build has none of them: drop them, so both compile the same library.
            self.compiler.set_executable("compiler_so", [self.compiler.compiler_so[0], "-fPIC"])
            flags = [*build_config.CFLAGS, *build_config.arch_flags(compiler)]
            for extension in self.extensions:
                extension.extra_compile_args = {"cxx": flags}
                extension.extra_link_args = build_config.LDFLAGS
            super().build_extensions()

    extension = CppExtension(  # type: ignore[no-untyped-call]
        build_config.EXTENSION,
        sources=[f"{KERNELS}/{name}" for name in build_config.source_names()],
        depends=[f"{KERNELS}/{path.name}" for path in sorted((ROOT / KERNELS).glob("*.h"))],
    )
    return {"ext_modules": [extension], "cmdclass": {"build_ext": BuildKernels}}


setup(**_extension_setup())
