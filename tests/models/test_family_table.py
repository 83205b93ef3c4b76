"""pagedserve/families.py is the one place a family's facts live: no package module outside it names a
family's HF architecture, model_type or GGUF architecture, the registries and config lists are the
table's, and the worker reaches models only through models/interface.py (also an import-linter contract,
checked by tests/test_layering.py). No model runs here."""

import ast
import re
from pathlib import Path

import pytest

from pagedserve.config import MODEL_ARCHITECTURES
from pagedserve.config.model import SEPARATE_PROJECTION_ARCHITECTURES
from pagedserve.config.pooling import DECODER_CLASSIFIER_ARCHITECTURES, ENCODER_ARCHITECTURES
from pagedserve.errors import ConfigError
from pagedserve.families import DECODERS, ENCODERS, FAMILIES, GGUF_ARCHITECTURES, decoder_family, family
from pagedserve.models.registry import DECODER_CLASSIFIERS, ENCODER_MODELS, MODELS

PACKAGE = Path(__file__).resolve().parents[2] / "pagedserve"
TABLE = PACKAGE / "families.py"
# Strings that are a family's name elsewhere but mean something else here: reasoning and tool-call parser
# names (--reasoning-parser qwen3, --tool-call-parser mistral), chosen by the user, not by the model.
OTHER_MEANINGS = {
    PACKAGE / "reasoning" / "parsers.py": {"qwen3", "mistral"},
    PACKAGE / "entrypoints" / "openai" / "tool_parsers" / "__init__.py": {
        "mistral",
        "deepseek_v3",
        "kimi_k2",
    },
}
# Any HF model class name, so that a family added outside the table is caught too.
HF_CLASS_NAME = re.compile(r"\w+(ForCausalLM|ForSequenceClassification|Model)")


def _family_names() -> set[str]:
    names: set[str] = set(GGUF_ARCHITECTURES)
    for facts in FAMILIES:
        names |= {
            facts.architecture,
            facts.model_type,
            *facts.config_aliases,
            *filter(None, [facts.classifier]),
        }
        if facts.gguf is not None and facts.gguf.sparse_architecture is not None:
            names.add(facts.gguf.sparse_architecture)
    return names


def _string_constants(tree: ast.Module) -> list[tuple[int, str]]:
    """Every string constant but docstrings (prose may name a family)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_module_restates_a_family_name() -> None:
    names = _family_names()
    # NOTE: parsing every module takes seconds; a constant equal to a name stands between quotes or
    # braces in the source, so only the files where such a word occurs are parsed.
    words = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    candidate = re.compile(rf"(?<![\w.-])({words}|{HF_CLASS_NAME.pattern})(?![\w-])")
    restated = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if path == TABLE or not candidate.search(text):
            continue
        allowed = OTHER_MEANINGS.get(path, set())
        for line, value in _string_constants(ast.parse(text)):
            if (value in names or HF_CLASS_NAME.fullmatch(value)) and value not in allowed:
                restated.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {value!r}")
    assert not restated, (
        "family names outside pagedserve/families.py (read the table instead):\n" + "\n".join(restated)
    )


def test_the_check_finds_a_restated_name(tmp_path: Path) -> None:
    """The scan above sees names in code (also inside f-strings), and skips docstrings."""
    source = '"""Qwen2ForCausalLM."""\nA = "qwen2moe"\nB = f"{A}Gemma2ForCausalLM"\n'
    found = {value for _, value in _string_constants(ast.parse(source))}
    assert {"qwen2moe", "Gemma2ForCausalLM"} <= found and "Qwen2ForCausalLM." not in found


def test_the_worker_imports_no_family_module() -> None:
    for path in (PACKAGE / "worker").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pagedserve.models"):
                assert node.module == "pagedserve.models.interface", f"{path.name} imports {node.module}"


def test_the_registries_and_config_lists_are_the_table() -> None:
    assert MODEL_ARCHITECTURES == {f.model_type: f.architecture for f in DECODERS}
    assert set(MODELS.names()) == {f.architecture for f in DECODERS}
    assert set(DECODER_CLASSIFIERS.names()) == set(DECODER_CLASSIFIER_ARCHITECTURES)
    assert (
        set(ENCODER_MODELS.names())
        == set(ENCODER_ARCHITECTURES)
        == {name for f in ENCODERS for name in (f.architecture, f.classifier)}
    )
    # LoRA and 4-bit checkpoints: dense families with separate q/k/v and gate/up in the checkpoint
    assert "Phi3ForCausalLM" not in SEPARATE_PROJECTION_ARCHITECTURES
    assert "MixtralForCausalLM" not in SEPARATE_PROJECTION_ARCHITECTURES
    assert "Qwen2ForCausalLM" in SEPARATE_PROJECTION_ARCHITECTURES


def test_every_family_module_defines_its_classes() -> None:
    """The strings the registry imports name classes that exist (read, not imported: no torch here)."""
    for facts in FAMILIES:
        source = (PACKAGE / "models" / f"{facts.module}.py").read_text()
        for name in (facts.architecture, facts.classifier if facts.encoder else None):
            if name is not None:
                assert re.search(rf"^(class {name}\b|{name} = )", source, re.M), (
                    f"{name} in {facts.module}.py"
                )


def test_lookups() -> None:
    assert family("Qwen3ForSequenceClassification") is family("Qwen3ForCausalLM")
    assert decoder_family("Qwen2MoeForCausalLM").moe is not None
    with pytest.raises(ConfigError, match="'BertModel' is not a decoder.*LlamaForCausalLM.*--model"):
        decoder_family("BertModel")
    assert family("GPT2LMHeadModel") is None
