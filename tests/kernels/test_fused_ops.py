"""The fused CPU layer kernels (kernels/cpu/fused_ops.cpp) against the layers' own torch ops, on random
inputs: float32 and bfloat16, odd widths, 1..256 rows."""

import pytest
import torch

from pagedserve.errors import ConfigError
from pagedserve.kernels import cpu as cpu_kernels
from pagedserve.kernels.cpu import fused_ops
from pagedserve.layers.activation import GeluAndMul, SiluAndMul
from pagedserve.layers.layernorm import GemmaRMSNorm, RMSNorm
from pagedserve.layers.rotary import RotaryEmbedding

# float32: summation order (and the kernel's own exp) only; bfloat16: one rounding step of 2^-8.
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}
DTYPES = [torch.float32, torch.bfloat16]
ROWS = [1, 7, 256]


@pytest.fixture(scope="module", autouse=True)
def kernels_built() -> None:
    error = cpu_kernels.load_cpu_kernels().error
    if error is not None:
        pytest.skip(f"native CPU kernels unavailable: {error}")
    assert fused_ops.usable(torch.zeros(1)), "built kernels must be used (PAGEDSERVE_FUSED_CPU_OPS unset)"


def random_norm(norm_class: type[RMSNorm], width: int, dtype: torch.dtype) -> RMSNorm:
    norm = norm_class(width, eps=1e-6).to(dtype)
    norm.weight.data.copy_(torch.randn(width) * 0.5 + (0.0 if norm_class is GemmaRMSNorm else 1.0))
    return norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_class", [RMSNorm, GemmaRMSNorm])
@pytest.mark.parametrize("rows,width", [(1, 576), (7, 33), (256, 960), (3, 1)])
def test_rms_norm(rows: int, width: int, norm_class: type[RMSNorm], dtype: torch.dtype) -> None:
    torch.manual_seed(rows * width)
    norm = random_norm(norm_class, width, dtype)
    x = (torch.randn(rows, width) * 3).to(dtype)
    expected = norm.forward_torch(x)
    out = norm(x)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_class", [RMSNorm, GemmaRMSNorm])
@pytest.mark.parametrize("rows,width", [(1, 576), (7, 33), (256, 960)])
def test_fused_add_rms_norm_in_place(
    rows: int, width: int, norm_class: type[RMSNorm], dtype: torch.dtype
) -> None:
    torch.manual_seed(rows + width)
    norm = random_norm(norm_class, width, dtype)
    x, residual = (torch.randn(rows, width) * 2).to(dtype), torch.randn(rows, width).to(dtype)
    expected_out, expected_sum = norm.forward_torch(x, residual)
    out, new_residual = norm(x.clone(), residual.clone())
    torch.testing.assert_close(new_residual, expected_sum, rtol=0, atol=0)  # one rounded add, as torch's
    torch.testing.assert_close(out, expected_out, **TOLERANCE[dtype])
    # vLLM's in-place contract: the results live in the tensors handed over.
    x_in, residual_in = x.clone(), residual.clone()
    out, new_residual = norm(x_in, residual_in)
    assert out.data_ptr() == x_in.data_ptr() and new_residual.data_ptr() == residual_in.data_ptr()


def test_rms_norm_non_contiguous_input_keeps_it() -> None:
    """A strided x (a column slice) takes a copy; the caller's tensor is left as it was."""
    torch.manual_seed(0)
    norm = random_norm(RMSNorm, 64, torch.float32)
    wide = torch.randn(5, 128)
    before = wide.clone()
    out = norm(wide[:, :64])
    torch.testing.assert_close(out, norm.forward_torch(wide[:, :64]), **TOLERANCE[torch.float32])
    assert torch.equal(wide, before)


def rotary(head_dim: int, partial: float, neox: bool, max_position: int = 4096) -> RotaryEmbedding:
    params = {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": partial}
    return RotaryEmbedding(head_dim, max_position, params, is_neox_style=neox)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("head_dim,partial", [(64, 1.0), (96, 0.5), (80, 0.4)])
@pytest.mark.parametrize("tokens", ROWS)
def test_rotary_in_place_on_fused_qkv_views(
    tokens: int, head_dim: int, partial: float, neox: bool, dtype: torch.dtype
) -> None:
    """q and k as the model has them: strided column views of one fused qkv projection."""
    torch.manual_seed(tokens + head_dim)
    num_heads, num_kv_heads = 9, 3
    rope = rotary(head_dim, partial, neox)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(tokens, q_size + 2 * kv_size).to(dtype)
    positions = torch.randint(0, 4096, (tokens,))
    q, k, v = qkv.clone().split([q_size, kv_size, kv_size], dim=-1)
    expected_q, expected_k = rope.forward_torch(positions, q, k)
    rope._step = None  # the torch path caches its cos/sin gather per positions tensor
    q_out, k_out = rope(positions, q, k)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()  # in place
    torch.testing.assert_close(q_out, expected_q, **TOLERANCE[dtype])
    torch.testing.assert_close(k_out, expected_k, **TOLERANCE[dtype])
    assert torch.equal(v, qkv[:, q_size + kv_size :])  # v untouched


def test_rotary_gptj_pairs_adjacent_values() -> None:
    """GPT-J style rotates (x0, x1) by the first angle: position 1, one pair, angle 1 rad at theta 1."""
    rope = RotaryEmbedding(2, 4, {"rope_theta": 1.0, "rope_type": "default"}, is_neox_style=False)
    q, k = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    q_out, k_out = rope(torch.tensor([1]), q, k)
    c, s = torch.cos(torch.tensor(1.0)), torch.sin(torch.tensor(1.0))
    torch.testing.assert_close(q_out, torch.stack([c, s]).view(1, 2))
    torch.testing.assert_close(k_out, torch.stack([-s, c]).view(1, 2))


@pytest.mark.parametrize("position", [-1, 4096, 2**63 - 1])
def test_rotary_position_outside_cache_raises(position: int) -> None:
    rope = rotary(64, 1.0, True)
    q, k = torch.randn(1, 128), torch.randn(1, 64)
    with pytest.raises(RuntimeError, match=r"positions\[0\] = .* is outside the rotary cache's \[0, 4096\)"):
        rope(torch.tensor([position]), q, k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", [SiluAndMul(), GeluAndMul("tanh")], ids=["silu", "gelu_tanh"])
@pytest.mark.parametrize("rows,width", [(1, 1536), (7, 37), (256, 512)])
def test_gated_activations(rows: int, width: int, layer: torch.nn.Module, dtype: torch.dtype) -> None:
    torch.manual_seed(rows * width)
    x = (torch.randn(rows, 2 * width) * 4).to(dtype)
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp's clamp, and zero
    out = layer(x)
    assert out.shape == (rows, width) and out.dtype == dtype
    torch.testing.assert_close(out, layer.forward_torch(x), **TOLERANCE[dtype])


def test_gated_activation_keeps_leading_dimensions() -> None:
    x = torch.randn(2, 3, 10)
    torch.testing.assert_close(SiluAndMul()(x), SiluAndMul().forward_torch(x), **TOLERANCE[torch.float32])


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("width", [4, 37])  # the scalar loop only; vectors of lanes and a scalar tail
def test_non_finite_inputs_propagate_as_torch(value: float, width: int) -> None:
    """A NaN or inf activation comes out NaN where torch's does (not hidden by exp's clamp)."""
    x = torch.randn(1, 2 * width)
    x[0, [0, width - 1]] = value
    assert torch.equal(torch.isnan(SiluAndMul()(x)), torch.isnan(SiluAndMul().forward_torch(x))), (
        "NaN where torch has none, or none where it has"
    )
    norm = random_norm(RMSNorm, 2 * width, torch.float32)
    assert torch.isnan(norm(x)).any() == torch.isnan(norm.forward_torch(x)).any()


def test_bad_shapes_raise_with_the_limit() -> None:
    with pytest.raises(RuntimeError, match="must be even"):
        fused_ops.silu_and_mul(torch.randn(2, 5))
    with pytest.raises(RuntimeError, match=r"weight must be contiguous \[8\]"):
        fused_ops.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6, False)
    with pytest.raises(RuntimeError, match="residual must match x"):
        fused_ops.fused_add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.ones(8), 1e-6, False)


@pytest.fixture
def fresh_switch(monkeypatch: pytest.MonkeyPatch):
    """PAGEDSERVE_FUSED_CPU_OPS is read once per process: re-read it in the test, and after it."""
    fused_ops._ops.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    fused_ops._ops.cache_clear()


def test_switch_off_keeps_the_torch_layers(fresh_switch: pytest.MonkeyPatch) -> None:
    fresh_switch.setenv("PAGEDSERVE_FUSED_CPU_OPS", "0")
    x, residual = torch.randn(2, 16), torch.randn(2, 16)
    before = x.clone()
    assert not fused_ops.usable(x)
    RMSNorm(16, 1e-6)(x, residual)
    assert torch.equal(x, before)  # the torch path leaves its inputs as they are


@pytest.mark.parametrize("raw", ["", "2", "-1", "yes", "1.0", str(2**64)])
def test_switch_rejects_other_values(fresh_switch: pytest.MonkeyPatch, raw: str) -> None:
    fresh_switch.setenv("PAGEDSERVE_FUSED_CPU_OPS", raw)
    with pytest.raises(ConfigError, match=r"PAGEDSERVE_FUSED_CPU_OPS=.* must be 0 .* or 1"):
        fused_ops.usable(torch.zeros(1))
