"""Native GGUF kernels against dequantize-then-float32-matmul (gguf-py's reference dequantizer)."""

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from gguf_reference import random_rows, reference_weight, rounded_activations

from pagedserve.errors import ConfigError
from pagedserve.kernels.cpu import gguf_ops, load_cpu_kernels
from pagedserve.kernels.cpu.float_ops import float_matmul
from pagedserve.kernels.cpu.gguf_ops import (
    DECODE_MAX_BATCH,
    GGML_BLOCK_FORMATS,
    INTEGER_ACTIVATION_TYPES,
    NATIVE_GGML_TYPES,
    gguf_dequantize,
    gguf_matmul,
    gguf_pack,
    gguf_packable,
    gguf_packed_matmul,
    gguf_packed_rows,
    gguf_set_amx,
)

pytestmark = pytest.mark.skipif(
    load_cpu_kernels().module is None, reason=f"native CPU kernels unavailable: {load_cpu_kernels().error}"
)

# SmolLM2-135M's weights as [N, K]: q, k/v, o, fused qkv, gate/up, fused gate_up, down, embedding/LM head.
SMOLLM2_SHAPES = [(576, 576), (192, 576), (960, 576), (1536, 576), (3072, 576), (576, 1536), (49152, 576)]
# K-quant blocks hold 256 weights: SmolLM2's K=576 does not fit them; Llama-like widths do.
K_QUANT_SHAPES = [(576, 1536), (256, 768)]
BATCHES = [1, 2, 8, 9, 64, 256]


def _cases() -> list[tuple[str, tuple[int, int]]]:
    cases = []
    for name, ggml_type in NATIVE_GGML_TYPES.items():
        shapes = K_QUANT_SHAPES if GGML_BLOCK_FORMATS[ggml_type][0] == 256 else SMOLLM2_SHAPES
        if name in ("F32", "F16"):
            shapes = shapes[:3]  # rows of one value: the same loop as every type, fewer shapes suffice
        cases += [(name, shape) for shape in shapes]
    return cases


@pytest.mark.parametrize(("type_name", "shape"), _cases())
def test_gguf_matmul_matches_dequantize_then_matmul(type_name: str, shape: tuple[int, int]) -> None:
    ggml_type, (n, k) = NATIVE_GGML_TYPES[type_name], shape
    rng = np.random.default_rng(n * 7 + k + ggml_type)
    rows = random_rows(ggml_type, n, k, rng)
    weight = reference_weight(rows, ggml_type)
    qweight = torch.from_numpy(rows)
    assert torch.equal(gguf_dequantize(qweight, ggml_type, k), weight)
    for batch in BATCHES if n < 49152 else [1, 9, 256]:
        x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch))
        expected = x.double() @ weight.double().T
        got = gguf_matmul(x, qweight, ggml_type)
        error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
        assert error < 1e-5, f"{type_name} {shape} batch {batch}: relative error {error:.2e}"


# Every decode batch size is its own compiled kernel; 9 takes the float GEMM path whatever the bits.
DECODE_BATCHES = [*range(1, DECODE_MAX_BATCH + 1), DECODE_MAX_BATCH + 1]


def _integer_cases() -> list[tuple[str, tuple[int, int], int]]:
    cases = []
    for name, ggml_type in NATIVE_GGML_TYPES.items():
        if ggml_type in INTEGER_ACTIVATION_TYPES:
            shapes = K_QUANT_SHAPES if GGML_BLOCK_FORMATS[ggml_type][0] == 256 else SMOLLM2_SHAPES
            cases += [(name, shape, bits) for shape in shapes for bits in (8, 16)]
    return cases


@pytest.mark.parametrize(("type_name", "shape", "bits"), _integer_cases())
def test_integer_activations_match_rounded_x_times_the_dequantized_weight(
    type_name: str, shape: tuple[int, int], bits: int
) -> None:
    """The integer path computes exactly on the rounded activations (float32 only in the per-block scaling);
    larger batches compute on x itself."""
    ggml_type, (n, k) = NATIVE_GGML_TYPES[type_name], shape
    rng = np.random.default_rng(n * 3 + k + ggml_type + bits)
    rows = random_rows(ggml_type, n, k, rng)
    weight = reference_weight(rows, ggml_type).double()
    qweight = torch.from_numpy(rows)
    batches = DECODE_BATCHES if n < 49152 else [1, DECODE_MAX_BATCH]
    for batch in batches:
        x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch)) * 3
        x_used = rounded_activations(x, bits) if batch <= DECODE_MAX_BATCH else x.double()
        expected = x_used @ weight.T
        got = gguf_matmul(x, qweight, ggml_type, bits)
        error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
        assert error < 1e-5, f"{type_name} {shape} {bits}-bit batch {batch}: relative error {error:.2e}"


@pytest.mark.parametrize("bits", [32, 16, 8])
def test_mxfp4_matches_dequantize_then_matmul(bits: int) -> None:
    """gpt-oss's expert type: odd shapes (37 rows, five blocks; a gpt-oss-wide K of 2880), decode batches and
    the tiled GEMM, activations a transposed view. Weights are exact integers times powers of two, so the
    integer paths equal the rounded activations times the dequantized weight within float32 rounding."""
    mxfp4 = gguf_ops.MXFP4_GGML_TYPE
    rng = np.random.default_rng(bits)
    for n, k in [(37, 160), (64, 2880)]:
        rows = random_rows(mxfp4, n, k, rng)
        weight = reference_weight(rows, mxfp4)
        qweight = torch.from_numpy(rows)
        assert torch.equal(gguf_dequantize(qweight, mxfp4, k), weight)
        for batch in [1, 2, 5, DECODE_MAX_BATCH, DECODE_MAX_BATCH + 1, 300]:
            x = (torch.randn(k, batch, generator=torch.Generator().manual_seed(batch)) * 3).t()
            x_used = rounded_activations(x, bits) if bits < 32 and batch <= DECODE_MAX_BATCH else x.double()
            expected = x_used @ weight.double().T
            error = (
                (gguf_matmul(x, qweight, mxfp4, bits).double() - expected).abs().max() / expected.abs().max()
            ).item()
            assert error < 1e-5, f"MXFP4 {(n, k)} {bits}-bit batch {batch}: relative error {error:.2e}"


# The 32-weight block types with a packed layout (the K-quants' is tested below, on their own shapes).
PACKED_TYPES = [
    name
    for name, ggml_type in NATIVE_GGML_TYPES.items()
    if gguf_packable(ggml_type, 16) and GGML_BLOCK_FORMATS[ggml_type][0] == 32
]
# SmolLM2's shapes, and rows that leave the last 16-row group part full.
PACKED_SHAPES = [*SMOLLM2_SHAPES, (37, 64), (1, 32)]
# Activation rows go through the integer kernel in chunks (8 on AVX-512, 4 on AVX2): every chunk count, full
# and partial last chunks; from 16 rows on, AMX tiles where the CPU has them (a padded last chunk at 27 and 33).
PACKED_BATCHES = [*range(1, 10), 16, 27, 33]


@pytest.mark.sampled(by="type_name")
@pytest.mark.parametrize(("type_name", "shape"), [(t, s) for t in PACKED_TYPES for s in PACKED_SHAPES])
def test_packed_rows_compute_as_the_file_rows(type_name: str, shape: tuple[int, int]) -> None:
    """gguf_pack's 16-row layout: on 8- and 16-bit activations, at every batch, the rounded x times the
    dequantized weight; on float activations the float x times it; a row lookup the weight's rows."""
    ggml_type, (n, k) = NATIVE_GGML_TYPES[type_name], shape
    rng = np.random.default_rng(n * 5 + k + ggml_type)
    rows = random_rows(ggml_type, n, k, rng)
    weight = reference_weight(rows, ggml_type)
    packed = gguf_pack(torch.from_numpy(rows), ggml_type)
    ids = torch.from_numpy(rng.integers(0, n, 9))
    assert torch.equal(gguf_packed_rows(packed, ggml_type, n, k, ids), weight[ids])
    for bits in (8, 16, 32):
        batches = PACKED_BATCHES if n < 49152 else [1, 33]
        for batch in batches if bits != 32 else [1, 9]:
            x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch)) * 3
            x_used = rounded_activations(x, bits) if bits != 32 else x.double()
            expected = x_used @ weight.double().T
            got = gguf_packed_matmul(x, packed, ggml_type, n, bits)
            error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
            assert error < 1e-5, f"{type_name} {shape} {bits}-bit batch {batch}: relative error {error:.2e}"


K_QUANT_TYPES = ["Q4_K", "Q5_K", "Q6_K"]
# Llama-like widths, a 1B-class square matrix, and rows that leave the last 16-row group part full.
K_PACKED_SHAPES = [(256, 768), (576, 1536), (2048, 2048), (37, 256), (1, 512)]
# Every chunk count of activation rows (8 on AVX-512, 4 on AVX2), partial last chunks, prefill-sized batches.
K_PACKED_BATCHES = [*range(1, 10), 16, 33, 64]


@pytest.mark.sampled(by="type_name")
@pytest.mark.parametrize(("type_name", "shape"), [(t, s) for t in K_QUANT_TYPES for s in K_PACKED_SHAPES])
def test_k_quants_packed_compute_on_integer_activation_blocks(type_name: str, shape: tuple[int, int]) -> None:
    """gguf_pack's K-quant layout (gguf_kquant_matmul.cpp): with 8-bit activations, or the 16-bit setting's
    15-bit blocks, at every batch size, the rounded x times the dequantized weight; float activations the
    float x times it; a row lookup the weight's rows, exactly."""
    ggml_type, (n, k) = NATIVE_GGML_TYPES[type_name], shape
    assert gguf_packable(ggml_type, 8) and gguf_packable(ggml_type, 16)
    rng = np.random.default_rng(n * 11 + k + ggml_type)
    rows = random_rows(ggml_type, n, k, rng)
    weight = reference_weight(rows, ggml_type)
    packed = gguf_pack(torch.from_numpy(rows), ggml_type)
    ids = torch.from_numpy(rng.integers(0, n, 9))
    assert torch.equal(gguf_packed_rows(packed, ggml_type, n, k, ids), weight[ids])
    for bits, rounded_bits in ((8, 8), (16, 15), (32, None)):
        for batch in K_PACKED_BATCHES if rounded_bits else [1, 9]:
            x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch)) * 3
            x_used = rounded_activations(x, rounded_bits, 256) if rounded_bits else x.double()
            expected = x_used @ weight.double().T
            got = gguf_packed_matmul(x, packed, ggml_type, n, bits)
            error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
            assert error < 1e-5, f"{type_name} {shape} {bits}-bit batch {batch}: relative error {error:.2e}"


def test_packed_float_prefill_under_inference_mode() -> None:
    """Float activations on Q4_0/Q4_1/Q8_0 without AMX multiply tiles on the worker threads: in inference
    mode (the engine's; 4096 columns: tiles of 64 rows, several tasks) the same result as outside it, the
    float x times the dequantized weight."""
    for type_name in ("Q4_0", "Q4_1", "Q8_0"):
        ggml_type = NATIVE_GGML_TYPES[type_name]
        rows = random_rows(ggml_type, 300, 4096, np.random.default_rng(ggml_type))
        weight = reference_weight(rows, ggml_type).double()
        packed = gguf_pack(torch.from_numpy(rows), ggml_type)
        x = torch.randn(100, 4096, generator=torch.Generator().manual_seed(ggml_type))
        gguf_set_amx(False)
        try:
            with torch.inference_mode():
                got = gguf_packed_matmul(x, packed, ggml_type, 300, 32)
            assert torch.equal(got, gguf_packed_matmul(x, packed, ggml_type, 300, 32))
        finally:
            gguf_set_amx(True)
        expected = x.double() @ weight.T
        assert ((got.double() - expected).abs().max() / expected.abs().max()).item() < 1e-5, type_name


@pytest.fixture
def amx() -> Iterator[None]:
    """The AMX path switched on (skipped where the build or the CPU has none), and back on after the test."""
    if not gguf_set_amx(True):
        pytest.skip("no AMX-INT8 here (CPU flag amx_int8, a build with it, the tile state from Linux 5.16+)")
    yield
    gguf_set_amx(True)


def _amx_and_vnni(
    x: torch.Tensor, packed: torch.Tensor, ggml_type: int, n: int, bits: int
) -> list[torch.Tensor]:
    """The packed matmul with the AMX path on, then off."""
    results = []
    for enabled in (True, False):
        gguf_set_amx(enabled)
        results.append(gguf_packed_matmul(x, packed, ggml_type, n, bits))
    gguf_set_amx(True)
    return results


# Rows that leave the last 16-row group part full; one, eight and 64 super-blocks a row (16384 columns: passes
# of 32 activation rows at 15 bits, 64 at 8, so batches 64 and 100 take several).
AMX_SHAPES = [(37, 256), (37, 2048), (37, 16384)]
# One 16-row chunk, chunks with 1 and 15 rows left to the VNNI path, two and four chunks, six plus four rows.
AMX_BATCHES = [16, 17, 31, 32, 64, 100]


@pytest.mark.parametrize(("type_name", "shape"), [(t, s) for t in K_QUANT_TYPES for s in AMX_SHAPES])
def test_k_quants_on_amx_equal_the_vnni_path(amx: None, type_name: str, shape: tuple[int, int]) -> None:
    """Whole 16-row chunks on AMX tiles, the rows left on the VNNI path: the same bits as all on the VNNI
    path (the same exact integer sums per super-block, scaled by the same float operations), and the rounded
    x (one scale per 256 values) times the weight."""
    ggml_type, (n, k) = NATIVE_GGML_TYPES[type_name], shape
    rng = np.random.default_rng(n * 13 + k + ggml_type)
    rows = random_rows(ggml_type, n, k, rng)
    weight = reference_weight(rows, ggml_type).double()
    packed = gguf_pack(torch.from_numpy(rows), ggml_type)
    for bits, rounded_bits in ((8, 8), (16, 15)):
        for batch in AMX_BATCHES:
            x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch)) * 3
            on_amx, on_vnni = _amx_and_vnni(x, packed, ggml_type, n, bits)
            assert torch.equal(on_amx, on_vnni), f"{type_name} {shape} {bits}-bit batch {batch}"
            expected = rounded_activations(x, rounded_bits, 256) @ weight.T
            error = ((on_amx.double() - expected).abs().max() / expected.abs().max()).item()
            assert error < 1e-5, f"{type_name} {shape} {bits}-bit batch {batch}: relative error {error:.2e}"


BLOCK_TYPES = ["Q4_0", "Q4_1", "Q8_0"]


@pytest.mark.parametrize(("type_name", "shape"), [(t, s) for t in ("Q4_0", "Q4_1") for s in AMX_SHAPES])
def test_blocks_on_amx_equal_the_vnni_path(amx: None, type_name: str, shape: tuple[int, int]) -> None:
    """Q4_0/Q4_1 on integer activations: from 16 rows on, AMX-BF16 tiles (the last chunk padded) give the
    same bits as the VNNI kernel (every block's integer dot exact in float32, scaled by the same float
    operations), so a row's result does not depend on its batch; and the rounded x times the weight."""
    ggml_type, (n, k) = NATIVE_GGML_TYPES[type_name], shape
    rng = np.random.default_rng(n * 17 + k + ggml_type)
    rows = random_rows(ggml_type, n, k, rng)
    # Weight row 0's first block all at its largest integer (15), activation row 0's all equal: the block's
    # dot is the largest there is (Q4_1: 15 * 32767 * 32, just under float32's exact 2^24).
    values_at = {"Q4_0": 2, "Q4_1": 4}[type_name]
    rows[0, values_at : GGML_BLOCK_FORMATS[ggml_type][1]] = 0xFF
    weight = reference_weight(rows, ggml_type).double()
    packed = gguf_pack(torch.from_numpy(rows), ggml_type)
    for bits in (8, 16):
        for batch in AMX_BATCHES:
            x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch)) * 3
            x[0, :32] = 1.0
            on_amx, on_vnni = _amx_and_vnni(x, packed, ggml_type, n, bits)
            assert torch.equal(on_amx, on_vnni), f"{type_name} {shape} {bits}-bit batch {batch}"
            assert torch.equal(on_amx[:1], gguf_packed_matmul(x[:1], packed, ggml_type, n, bits))
            expected = rounded_activations(x, bits) @ weight.T
            error = ((on_amx.double() - expected).abs().max() / expected.abs().max()).item()
            assert error < 1e-5, f"{type_name} {shape} {bits}-bit batch {batch}: relative error {error:.2e}"


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_packed_float_prefill_on_amx(amx: None, type_name: str) -> None:
    """Q4_0/Q4_1/Q8_0 on float activations (the exact setting) on AMX-BF16 tiles (each value split into three
    bfloat16): within float32 rounding of the float x times the dequantized weight, as the ATen GEMM path
    (AMX off) is, and a row's result the same bits whatever shares its batch (the last chunk padded)."""
    ggml_type = NATIVE_GGML_TYPES[type_name]
    rows = random_rows(ggml_type, 37, 1024, np.random.default_rng(ggml_type))
    weight = reference_weight(rows, ggml_type).double()
    packed = gguf_pack(torch.from_numpy(rows), ggml_type)
    x = torch.randn(100, 1024, generator=torch.Generator().manual_seed(ggml_type)) * 3
    on_amx, on_aten = _amx_and_vnni(x, packed, ggml_type, 37, 32)
    expected = x.double() @ weight.T
    for got in (on_amx, on_aten):
        assert ((got.double() - expected).abs().max() / expected.abs().max()).item() < 1e-5
    for batch in (16, 33, 47, 64):
        assert torch.equal(gguf_packed_matmul(x[:batch], packed, ggml_type, 37, 32), on_amx[:batch])


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("type_name", ["Q4_K", "Q4_1"])
def test_amx_non_finite_activations_poison_only_their_row(amx: None, type_name: str, bits: int) -> None:
    """Rows 1 and 2 in the first AMX chunk, 32 in the last (K-quants: left to the VNNI path; Q4_1: padded)."""
    ggml_type = NATIVE_GGML_TYPES[type_name]
    rows = random_rows(ggml_type, 64, 512, np.random.default_rng(bits))
    packed = gguf_pack(torch.from_numpy(rows), ggml_type)
    x = torch.randn(33, 512)
    x[0] = 0.0
    x[1, 100] = float("inf")
    x[2, 7] = float("nan")
    x[32, 300] = float("nan")
    on_amx, on_vnni = _amx_and_vnni(x, packed, ggml_type, 64, bits)
    assert torch.equal(on_amx[0], torch.zeros(64))
    assert not torch.isfinite(on_amx[1]).any()
    assert torch.isnan(on_amx[2]).all() and torch.isnan(on_amx[32]).all()
    finite = [0, *range(3, 32)]
    assert torch.isfinite(on_amx[finite]).all() and torch.equal(on_amx[finite], on_vnni[finite])


@pytest.mark.parametrize("raw", ["", "2", "yes", "true"])
def test_amx_switch_rejects_other_values(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    """PAGEDSERVE_CPU_AMX is read when the ops are first used: re-read here, and again after the test."""
    gguf_ops._ops.cache_clear()
    monkeypatch.setenv("PAGEDSERVE_CPU_AMX", raw)
    try:
        with pytest.raises(ConfigError, match=r"PAGEDSERVE_CPU_AMX=.* must be 0 .* or 1"):
            gguf_ops.gguf_set_amx(True)
    finally:
        monkeypatch.undo()
        gguf_ops._ops.cache_clear()


def test_packed_layout_rejects_what_it_cannot_hold() -> None:
    f16, q4_1, q4_k = NATIVE_GGML_TYPES["F16"], NATIVE_GGML_TYPES["Q4_1"], NATIVE_GGML_TYPES["Q4_K"]
    assert not gguf_packable(f16, 8) and not gguf_packable(q4_1, 32)
    with pytest.raises(RuntimeError, match="cannot be packed"):
        gguf_pack(torch.zeros(16, 512, dtype=torch.uint8), f16)
    with pytest.raises(RuntimeError, match="not a multiple of 256"):
        gguf_packed_matmul(
            torch.zeros(1, 32), gguf_pack(torch.zeros(16, 144, dtype=torch.uint8), q4_k), q4_k, 16, 8
        )
    packed = gguf_pack(torch.zeros(16, 20 * 18, dtype=torch.uint8), q4_1)  # Q4_1 rows of K=576
    with pytest.raises(RuntimeError, match="activation_bits must be 8, 16 or 32"):
        gguf_packed_matmul(torch.zeros(1, 576), packed, q4_1, 16, 4)
    with pytest.raises(RuntimeError, match="output of gguf_pack"):
        gguf_packed_matmul(torch.zeros(1, 576), packed, q4_1, 17, 16)  # a second group it does not have
    with pytest.raises(RuntimeError, match="outside"):
        gguf_packed_rows(packed, q4_1, 16, 576, torch.tensor([16]))


@pytest.mark.parametrize(
    ("type_name", "bits", "packed"),
    [("Q4_1", bits, packed) for bits in (8, 16, 32) for packed in (False, True)]
    + [("Q6_K", bits, True) for bits in (8, 16)],
)
def test_decode_kernel_edge_inputs(type_name: str, bits: int, packed: bool) -> None:
    """Zero blocks give zeros, a non-finite activation makes only its own row non-finite, batch 0 is empty."""
    ggml_type = NATIVE_GGML_TYPES[type_name]
    k = 576 if ggml_type == NATIVE_GGML_TYPES["Q4_1"] else 512
    rows = random_rows(ggml_type, 64, k, np.random.default_rng(bits))
    qweight = torch.from_numpy(rows)
    x = torch.randn(3, k)
    x[0] = 0.0
    x[1, 100] = float("inf")
    x[2, 7] = float("nan")
    packed_weight = gguf_pack(qweight, ggml_type)

    def matmul(x: torch.Tensor, qweight: torch.Tensor, ggml_type: int, bits: int) -> torch.Tensor:
        if packed:
            return gguf_packed_matmul(x, packed_weight, ggml_type, 64, bits)
        return gguf_matmul(x, qweight, ggml_type, bits)

    got = matmul(x, qweight, ggml_type, bits)
    assert torch.equal(got[0], torch.zeros(64))
    assert not torch.isfinite(got[1]).any() and torch.isnan(got[2]).all()
    assert matmul(torch.zeros(0, k), qweight, ggml_type, bits).shape == (0, 64)


@pytest.mark.parametrize("bits", [-1, 0, 4, 31, 64, 2**63 - 1])
def test_gguf_matmul_rejects_other_activation_widths(bits: int) -> None:
    qweight = torch.zeros(4, 20 * 18, dtype=torch.uint8)  # Q4_1 rows of K=576
    with pytest.raises(RuntimeError, match="activation_bits must be 8, 16 or 32"):
        gguf_matmul(torch.zeros(1, 576), qweight, NATIVE_GGML_TYPES["Q4_1"], bits)


def test_gguf_matmul_rejects_a_row_size_that_does_not_match_the_type() -> None:
    qweight = torch.zeros(4, 20 * 18, dtype=torch.uint8)  # Q4_1 rows of K=576
    with pytest.raises(RuntimeError, match="bytes per row"):
        gguf_matmul(torch.zeros(1, 576), qweight, NATIVE_GGML_TYPES["Q8_0"])


@pytest.mark.parametrize("type_name", ["F32", "F16"])
def test_float_rows_give_a_row_the_same_bits_at_every_batch(type_name: str) -> None:
    """F32 and F16 tensors (an output head a GGUF keeps in float) multiply through the row-invariant float
    kernel at every batch: row 0's result alone equals its result among 2..64 rows (it was a row dot up to
    8 rows, a dequantize + GEMM above), and equals float_matmul on the weight as float16 / float32."""
    ggml_type = NATIVE_GGML_TYPES[type_name]
    rows = random_rows(ggml_type, 200, 576, np.random.default_rng(ggml_type))
    weight = torch.from_numpy(rows).view(torch.float32 if type_name == "F32" else torch.float16)
    x = torch.randn(64, 576, generator=torch.Generator().manual_seed(3))
    alone = gguf_matmul(x[:1], torch.from_numpy(rows), ggml_type)
    assert torch.equal(alone, float_matmul(x[:1], weight))
    for batch in (2, DECODE_MAX_BATCH, DECODE_MAX_BATCH + 1, 17, 64):
        assert torch.equal(gguf_matmul(x[:batch], torch.from_numpy(rows), ggml_type)[:1], alone), batch
