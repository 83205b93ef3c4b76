"""The GGUF kernels and the greedy argmax built for the instruction sets this machine's build does not use:
AVX2 alone (maddubs + madd instead of VNNI's byte dots, 8 lanes) and baseline x86-64 (the plain C++
fallbacks), each compiled in a subprocess and checked against the dequantized weight times the rounded
activations, and against numpy's argmax. Compiling costs
minutes, so this runs with `-m nightly`, not in CI (which builds for its own CPU, tested by test_gguf_matmul)."""

import os
import subprocess
import sys
import textwrap

import pytest

from pagedserve.kernels.cpu import build_config

SOURCES = [
    "gguf_matmul.cpp",
    "gguf_decode_matmul.cpp",
    "gguf_packed_matmul.cpp",
    "gguf_packed_greedy.cpp",
    "gguf_kquant_matmul.cpp",
    "gguf_kquant_amx.cpp",
    "gguf_block_amx.cpp",
    "float_matmul.cpp",  # row_invariant::matmul, which the GGUF kernels' float32 path calls
    "greedy_argmax.cpp",  # also the LM head's argmax where its kernel does not fold it in
]

CHECK = textwrap.dedent(
    """
    import sys, numpy as np, torch
    from torch.utils import cpp_extension
    folder, arch, build = sys.argv[1:4]
    cpp_extension.load(
        name="gguf_" + arch.replace("-", "_"), build_directory=build, is_python_module=False,
        sources=[folder + "/" + name for name in {sources}],
        extra_cflags=["-O3", "-ffp-contract=fast", "-fno-trapping-math", "-fopenmp", "-march=" + arch],
        extra_ldflags=["-fopenmp"],
    )
    sys.path.insert(0, {tests!r})
    from gguf_reference import random_rows, reference_weight, rounded_activations
    ops = torch.ops.pagedserve
    for ggml_type in (2, 3, 8, 12, 13, 14):
        k = 512
        rows = random_rows(ggml_type, 37, k, np.random.default_rng(ggml_type))
        weight = reference_weight(rows, ggml_type).double()
        for bits, rounded_bits in ((8, 8), (16, 15 if ggml_type >= 12 else 16), (32, None)):
            if not ops.gguf_packable(ggml_type, bits):
                continue
            packed = ops.gguf_pack(torch.from_numpy(rows), ggml_type)
            for batch in (1, 5, 9, 40):
                x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch))
                block = 256 if ggml_type >= 12 else 32  # K-quants: one scale per super-block
                expected = (rounded_activations(x, rounded_bits, block) if rounded_bits else x.double()) @ weight.T
                got = ops.gguf_packed_matmul(x, packed, ggml_type, 37, bits).double()
                error = ((got - expected).abs().max() / expected.abs().max()).item()
                assert error < 1e-5, (arch, ggml_type, bits, batch, error)
                logits, tokens = ops.gguf_packed_matmul_greedy(x, packed, ggml_type, 37, bits)
                assert torch.equal(logits.double(), got) and torch.equal(tokens, logits.argmax(1)), (arch, ggml_type)
        got = ops.gguf_matmul(torch.ones(3, k), torch.from_numpy(rows), ggml_type, 32).double()
        assert torch.allclose(got, torch.ones(3, k, dtype=torch.float64) @ weight.T, rtol=1e-5, atol=1e-5)
    for vocab in (1, 7, 31, 33, 1000, 4099):
        logits = torch.randn(9, vocab, generator=torch.Generator().manual_seed(vocab))
        logits[1, vocab // 2] = logits[1].max()  # a tie: the first wins
        logits[2, vocab - 1] = float("nan")
        logits[3] = float("-inf")
        assert (ops.greedy_argmax(logits).numpy() == logits.numpy().argmax(axis=1)).all(), (arch, vocab)
    print("ok", arch)
    """
)


@pytest.mark.nightly
@pytest.mark.parametrize("arch", ["haswell", "x86-64"])
def test_kernels_on_other_instruction_sets(arch: str, tmp_path) -> None:
    if not build_config.compiler_accepts(build_config.cxx_compiler(), [f"-march={arch}"]):
        pytest.skip(f"the compiler does not take -march={arch}")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = os.path.join(os.path.dirname(tests), "pagedserve", "kernels", "cpu")
    code = CHECK.format(sources=SOURCES, tests=tests)
    result = subprocess.run(
        [sys.executable, "-c", code, folder, arch, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0 and f"ok {arch}" in result.stdout, result.stderr[-3000:]
