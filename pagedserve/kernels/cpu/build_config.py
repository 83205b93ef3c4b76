"""How the native CPU kernels are compiled, and how a library compiled at install is recognized.

Both builds use it: setup.py's (at `pip install --no-build-isolation`), which loads this file by path
before pagedserve is importable, and the JIT build in `__init__.py` (on first use, when there is no
usable prebuilt library). So it imports nothing from pagedserve, and torch only inside functions.
"""

import ast
import hashlib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

FOLDER = Path(__file__).parent
# The library setup.py builds (a pybind module; its ops register in torch.ops.pagedserve), and the record
# of what it was built from, written beside it once the build succeeded.
EXTENSION = "pagedserve.kernels.cpu._C"
BUILD_INFO = FOLDER / "_C.build.json"
PREBUILD_COMMAND = "pip install --no-build-isolation -e ."

# NOTE: -fno-trapping-math lets GCC vectorize the float->int conversion in the softmax's exp;
# -ffp-contract=fast fuses multiply-adds (GCC leaves them apart in ISO C++ mode).
CFLAGS = ["-O3", "-ffp-contract=fast", "-fno-trapping-math", "-fopenmp"]
LDFLAGS = ["-fopenmp"]


def source_names() -> list[str]:
    """The file names in `__init__.py`'s `_SOURCES`, read without importing it (setup.py cannot import
    pagedserve): that list stays the one place a new source is added, for both builds."""
    tree = ast.parse((FOLDER / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_SOURCES" for t in node.targets):
            return [
                n.value
                for n in ast.walk(node.value)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith(".cpp")
            ]
    raise RuntimeError(f"no _SOURCES list in {FOLDER / '__init__.py'}")


def sources_digest(folder: Path) -> str:
    """A digest of the C++ sources and headers in `folder` (names and contents)."""
    digest = hashlib.sha256()
    # NOTE: by suffix, not a glob like "*.[ch]*", which also matches the built "_C.cpython-311-….so".
    for path in sorted(p for p in folder.iterdir() if p.suffix in (".cpp", ".h")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def cxx_compiler() -> str:
    """The compiler torch's cpp_extension compiles with, at first use and in setup.py's ninja build."""
    return os.environ.get("CXX", "c++")


def arch_flags(compiler: str) -> list[str]:
    """-march=native where the compiler takes it, else AVX2+FMA+F16C where this CPU has them (every AVX2
    CPU has F16C: the fp8 kernel widens weights with it), else none."""
    import torch

    if compiler_accepts(compiler, ["-march=native"]):
        return ["-march=native"]
    has_avx2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    if has_avx2 and compiler_accepts(compiler, ["-mavx2", "-mfma", "-mf16c"]):
        return ["-mavx2", "-mfma", "-mf16c"]
    return []


def compiler_accepts(compiler: str, flags: list[str]) -> bool:
    """Whether `compiler` compiles an empty C++ program with `flags` (False too when it is missing)."""
    try:
        subprocess.run(
            [compiler, *flags, "-x", "c++", "-c", "-o", os.devnull, "-"],
            input=b"int main() {}",
            capture_output=True,
            check=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def cpu_flags() -> list[str]:
    """This CPU's feature flags (Linux's /proc/cpuinfo), [] where unknown."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):  # x86, arm64
                    return sorted(line.partition(":")[2].split())
    except OSError:
        pass
    return []


def build_record() -> dict[str, object]:
    """What a library compiled here and now is tied to: the sources, the torch it links against, the CPU
    that -march=native compiled for. setup.py writes it to BUILD_INFO; a process compares its own."""
    import torch

    return {
        "sources_digest": sources_digest(FOLDER),
        "torch_version": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_flags": cpu_flags(),
    }


def prebuilt_mismatch(built: Mapping[str, object], here: Mapping[str, object]) -> str | None:
    """Why a library built as `built` (BUILD_INFO) must not be loaded in a process whose `build_record()`
    is `here`, or None when it may. Code compiled for CPU features this CPU lacks would die of SIGILL
    (-march=native: an AVX-512 build on an AVX2 CPU), hence the capability and every flag of the build's
    CPU; another torch would break its ABI; other sources would make it stale."""
    for key, what in (
        ("sources_digest", "the C++ sources changed since the install built it"),
        ("torch_version", "it was built against another torch"),
        ("cpu_capability", "it was built for another CPU capability"),
    ):
        if built.get(key) != here.get(key):
            return f"{what} ({key} {built.get(key)}, here {here.get(key)})"
    built_flags, here_flags = built.get("cpu_flags"), here.get("cpu_flags")
    if not isinstance(built_flags, list) or not isinstance(here_flags, list):
        return "no CPU flags recorded"
    missing = sorted(set(built_flags) - set(here_flags))
    if missing:
        return f"it was built for a CPU with features this one lacks ({', '.join(missing[:8])})"
    return None
