"""docs/design.md says what the code does: the attention backend each platform defaults to.

design.md states it in two forms, which this test reads: the Platforms section's "default attention
backend (what `--attention-backend auto` picks: `cpu` ... on CPU; `triton` on CUDA; ...)", and "the CPU
default (`--attention-backend cpu`)" where a backend is described. Every "CPU default" / "CUDA default"
phrase must name its backend that way, so a sentence naming another default cannot slip past."""

import re
from pathlib import Path

import pytest

from pagedserve.attention.backends import ATTENTION_BACKENDS, select_attention_backend
from pagedserve.kernels import cpu as cpu_kernels
from pagedserve.platforms import get_platform

DESIGN = Path(__file__).resolve().parent.parent / "docs" / "design.md"
DEVICES = ("cpu", "cuda")  # get_platform's devices; design.md writes them upper-case

PLATFORMS_SENTENCE = re.compile(r"default attention backend \(([^)]*)\)")
PICK_ON_PLATFORM = re.compile(r"`(\w+)`[^;`]*? on (CPU|CUDA)\b")
DEFAULT_PHRASE = re.compile(r"\b(CPU|CUDA) default\b(?! \w)")  # "the CUDA default", not "CPU default KV"
NAMED_DEFAULT = re.compile(r"\b(CPU|CUDA) default \(`--attention-backend (\w+)`\)")
FLAG_VALUE = re.compile(r"`--attention-backend (\w+)`")


def design_text() -> str:
    return " ".join(DESIGN.read_text().split())  # one line: sentences wrap anywhere


def stated_defaults(text: str) -> dict[str, set[str]]:
    """Platform (CPU, CUDA) -> the backends design.md names as its default."""
    stated: dict[str, set[str]] = {}
    sentences = PLATFORMS_SENTENCE.findall(text)
    assert len(sentences) == 1, "design.md's Platforms section names the default attention backend once"
    pairs = [(platform, name) for name, platform in PICK_ON_PLATFORM.findall(sentences[0])]
    for platform, name in pairs + NAMED_DEFAULT.findall(text):
        stated.setdefault(platform, set()).add(name)
    return stated


def picked(device: str) -> str:
    """What `--attention-backend auto` picks on `device`'s platform when its backends can run: the native
    CPU kernels built (the real build, cached), triton importable (no GPU needed to pick it)."""
    if device == "cuda":
        pytest.importorskip("triton", reason="auto picks torch on CUDA without triton")
    elif cpu_kernels.load_cpu_kernels().error:
        pytest.skip(f"native CPU kernels unavailable: {cpu_kernels.load_cpu_kernels().error}")
    return select_attention_backend("auto", get_platform(device)).name


def test_design_states_the_default_attention_backends_the_code_picks() -> None:
    expected = {device.upper(): {picked(device)} for device in DEVICES}
    stated = stated_defaults(design_text())
    assert stated == expected, f"design.md states {stated}; --attention-backend auto picks {expected}"


def test_every_platform_default_phrase_names_its_backend() -> None:
    text = design_text()
    assert len(DEFAULT_PHRASE.findall(text)) == len(NAMED_DEFAULT.findall(text)), (
        "design.md says 'the CPU/CUDA default' without naming it as "
        "'the CUDA default (`--attention-backend NAME`)'"
    )


def test_design_names_only_registered_backends() -> None:
    text = design_text()
    platforms_sentence = PLATFORMS_SENTENCE.findall(text)[0]
    names = {*FLAG_VALUE.findall(text), *(name for name, _ in PICK_ON_PLATFORM.findall(platforms_sentence))}
    assert names - {"auto"} <= set(ATTENTION_BACKENDS.names())
