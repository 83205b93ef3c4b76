"""The batched multi-LoRA kernels (kernels/cpu/lora_bgmv.cpp, kernels/triton/lora.py) against
`add_lora_reference` on random batches: decode- and prefill-sized, odd widths, ranks that are no multiple
of the vector width, slots mixed, repeated and -1. The reference itself is checked once against a plain
per-token loop. Both kernels are batch invariant: a token's row is the same bits alone and in any batch.
The Triton kernels run through Triton's interpreter on CPU (small shapes: it is slow)."""

from collections.abc import Callable

import pytest
import torch
from interpreted_triton import DEVICE, import_triton_kernels

from pagedserve.kernels import cpu as cpu_kernels
from pagedserve.lora.ops import add_lora, add_lora_reference

triton_kernels = import_triton_kernels()

# float32: summation order only; bfloat16/float16: y + update rounded once, so one step of 2^-8 (2^-11).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}  # rtol and atol

# y, x, lora_a, lora_b, slots
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@pytest.fixture(scope="module")
def native() -> None:
    error = cpu_kernels.load_cpu_kernels().error
    if error is not None:
        pytest.skip(f"native CPU kernels unavailable: {error}")


def random_batch(
    tokens: int,
    in_features: int,
    out_features: int,
    rank: int,
    adapters: int,
    dtype: torch.dtype,
    weight_dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Batch:
    """y, x, lora_a, lora_b, slots: slots drawn from [-1, adapters), so some repeat and some are -1."""
    x = torch.randn(tokens, in_features).to(dtype)
    y = torch.randn(tokens, out_features).to(dtype)
    lora_a = (torch.randn(adapters, rank, in_features) * in_features**-0.5).to(weight_dtype)
    lora_b = torch.randn(adapters, rank, out_features).to(weight_dtype)  # B transposed: add_lora's layout
    slots = torch.randint(-1, adapters, (tokens,), dtype=torch.int32)
    return y.to(device), x.to(device), lora_a.to(device), lora_b.to(device), slots.to(device)


def check_against_reference(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    slots: torch.Tensor,
    op: Callable[..., None] = add_lora,
) -> None:
    """`op` on a copy of y against the reference on another: close, and base-model rows untouched."""
    actual, expected = y.clone(), y.clone()
    op(actual, x, lora_a, lora_b, slots)
    add_lora_reference(expected, x, lora_a, lora_b, slots)
    torch.testing.assert_close(actual, expected, rtol=TOLERANCE[y.dtype], atol=TOLERANCE[y.dtype])
    assert torch.equal(actual[slots < 0], y[slots < 0])


def test_reference_matches_a_per_token_loop() -> None:
    """The reference's float32 matmuls against the sums written out, in float64."""
    torch.manual_seed(0)
    y, x, lora_a, lora_b, slots = random_batch(9, 13, 11, 3, 4, torch.float32)
    slots[:3] = torch.tensor([-1, 2, 2], dtype=torch.int32)
    expected = y.double()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            for o in range(y.shape[1]):
                expected[t, o] += sum(
                    lora_b[slot, r, o].double()
                    * sum(lora_a[slot, r, i].double() * x[t, i] for i in range(13))
                    for r in range(3)
                )
    add_lora_reference(y, x, lora_a, lora_b, slots)
    torch.testing.assert_close(
        y, expected.float(), rtol=TOLERANCE[torch.float32], atol=TOLERANCE[torch.float32]
    )


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [1, 16, 17, 64])
@pytest.mark.parametrize(
    "tokens,in_features,out_features,adapters",
    [(0, 64, 48, 2), (1, 7, 100, 1), (1, 2049, 33, 3), (37, 100, 2049, 5), (300, 256, 160, 2)],
)
def test_native_matches_reference(
    tokens: int, in_features: int, out_features: int, adapters: int, rank: int, dtype: torch.dtype
) -> None:
    torch.manual_seed(tokens + rank)
    check_against_reference(*random_batch(tokens, in_features, out_features, rank, adapters, dtype))


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_native_weights_in_the_activation_dtype(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    check_against_reference(*random_batch(23, 130, 70, 24, 3, dtype, weight_dtype=dtype))


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("rank", [1, 16, 37])
def test_native_prefill_of_one_adapter_int64_slots(rank: int) -> None:
    """A prefill chunk: 512 tokens of one adapter (then a few decodes of others), slots as int64."""
    torch.manual_seed(2)
    y, x, lora_a, lora_b, _ = random_batch(520, 256, 390, rank, 4, torch.float32)
    slots = torch.tensor([3] * 512 + [0, -1, 1, 2, 0, 0, -1, 3])
    check_against_reference(y, x, lora_a, lora_b, slots)


@pytest.mark.usefixtures("native")
def test_native_rejects_bad_inputs() -> None:
    y, x, lora_a, lora_b, slots = random_batch(4, 8, 6, 2, 3, torch.float32)
    with pytest.raises(RuntimeError, match=r"slots\[0\] = 3 is outside \[-1, 3\)"):
        add_lora(y, x, lora_a, lora_b, torch.tensor([3, 0, 0, 0]))
    with pytest.raises(RuntimeError, match="lora_a and lora_b must be"):
        add_lora(y, x, lora_a, lora_b.transpose(1, 2).contiguous(), slots)
    with pytest.raises(RuntimeError, match="x's dtype"):
        add_lora(y, x.bfloat16(), lora_a, lora_b, slots)
    with pytest.raises(RuntimeError, match="must both be float32 or both"):
        add_lora(y, x, lora_a.half(), lora_b.half(), slots)
    with pytest.raises(RuntimeError, match="slots must be int32 or int64"):
        add_lora(y, x, lora_a, lora_b, slots.float())


# On CPU the interpreter computes in float32 only (its bf16 arithmetic is broken); on a GPU bf16 too.
TRITON_DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]


@pytest.mark.parametrize("dtype", TRITON_DTYPES)
@pytest.mark.parametrize(
    "tokens,in_features,out_features,rank,adapters",
    [(0, 8, 8, 2, 1), (1, 7, 100, 1, 1), (6, 100, 65, 17, 3), (5, 33, 70, 128, 2)],
)
def test_triton_matches_reference(
    tokens: int, in_features: int, out_features: int, rank: int, adapters: int, dtype: torch.dtype
) -> None:
    torch.manual_seed(tokens + rank)
    batch = random_batch(tokens, in_features, out_features, rank, adapters, dtype, device=DEVICE)
    check_against_reference(*batch, op=triton_kernels.add_lora)


# Batches around one token of slot 1 (its position, every token's slot): alone; inside a long prefill run of
# its adapter (before, at and after the cut at 64 tokens); beside other adapters and the base model.
TOKEN_SLOT = 1
BATCHES = [
    (0, [1]),
    (0, [1] * 50),
    (49, [1] * 50),
    (63, [1] * 130),
    (64, [1] * 130),
    (129, [1] * 130),
    (2, [0, -1, 1, 2, 1, 1, 0]),
    (5, [0, 1, 2, -1] * 3),
]


def rows_in_batches(
    op: Callable[..., None],
    dtype: torch.dtype,
    batches: list[tuple[int, list[int]]],
    sizes: tuple[int, int, int] = (130, 200, 17),
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One token's float64 y + B (A x), and its row of y after `op` in each batch of `batches` (the other
    tokens random)."""
    torch.manual_seed(5)
    in_features, out_features, rank = sizes
    _, _, lora_a, lora_b, _ = random_batch(0, in_features, out_features, rank, 3, dtype, device=device)
    x, y = torch.randn(in_features).to(dtype), torch.randn(out_features).to(dtype)
    rows = []
    for position, slots in batches:
        batch_y, batch_x, _, _, _ = random_batch(len(slots), in_features, out_features, 1, 1, dtype)
        batch_x[position], batch_y[position] = x, y
        batch_y = batch_y.to(device)
        op(batch_y, batch_x.to(device), lora_a, lora_b, torch.tensor(slots, dtype=torch.int32, device=device))
        rows.append(batch_y[position].cpu())
    a, b = lora_a[TOKEN_SLOT].cpu().double(), lora_b[TOKEN_SLOT].cpu().double()
    return y.double() + (a @ x.double()) @ b, rows


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_token_is_the_same_bits_in_every_batch(dtype: torch.dtype) -> None:
    """A token's row alone, in a run of its adapter (any length, any place, across the cut at 64 tokens),
    beside other adapters and base-model tokens, on 1 to 3 threads: the same bits, close to float64."""
    threads = torch.get_num_threads()
    try:
        rows = []
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            expected, found = rows_in_batches(add_lora, dtype, BATCHES)
            rows += found
    finally:
        torch.set_num_threads(threads)
    for position, row in enumerate(rows):
        assert torch.equal(row, rows[0]), f"batch {position % len(BATCHES)} moved the token's row"
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(rows[0].double(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", TRITON_DTYPES)
def test_triton_token_is_the_same_bits_in_every_batch(dtype: torch.dtype) -> None:
    """The Triton kernels: one program per token (and block of outputs), block sizes from the rank alone."""
    batches = [(0, [1]), (3, [1] * 9), (2, [0, -1, 1, 2, 1])]
    expected, rows = rows_in_batches(triton_kernels.add_lora, dtype, batches, (70, 100, 17), DEVICE)
    for position, row in enumerate(rows):
        assert torch.equal(row, rows[0]), f"batch {position} moved the token's row"
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(rows[0].double(), expected, rtol=tolerance, atol=tolerance)
