"""Which GGUF file of a Hub repo `org/name:QUANT` names, chosen from the repo's file listing before anything
is downloaded: the one model whose name holds QUANT as a whole token, in any case, with its split parts
(`-00001-of-00003.gguf`). A vision projector (`mmproj-F16.gguf`) is no model."""

import os
import re
from dataclasses import dataclass

from pagedserve.errors import ConfigError

_QUANT = re.compile(r"^[\w.-]+$")
_SPLIT_PART = re.compile(r"^(?P<stem>.+)-\d{5}-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# NOTE: '_' is no separator: it joins a quantization type's parts (Q4_K_M, IQ4_XS, Q4_0_4_4), so Q4_0 is not
# a token of Q4_0_4_4 nor XS of IQ4_XS; '-', '.' and '/' (a folder) are.
_SEPARATOR = re.compile(r"[-./]")


@dataclass(frozen=True)
class GgufModel:
    """One model of a repo: a GGUF file, or the parts of a split one in order."""

    files: tuple[str, ...]

    @property
    def name(self) -> str:
        """What the tag is matched against: the path, without a split part's `-0000i-of-0000n.gguf`."""
        split = _SPLIT_PART.match(self.files[0])
        return split["stem"] if split else self.files[0]


def check_quant(repo_id: str, quant: str, what: str) -> None:
    if not _QUANT.match(quant):
        raise ConfigError(
            f"{what} {repo_id}:{quant}: after the colon comes a GGUF quantization type such as Q4_K_M "
            "(letters, digits, '_', '-' or '.')."
        )


def gguf_models(repo_files: list[str]) -> list[GgufModel]:
    """The repo's GGUF models, the parts of a split file grouped as one (in part order)."""
    groups: dict[str, list[str]] = {}
    for path in sorted(repo_files):
        if not path.lower().endswith(".gguf") or "mmproj" in _tokens(os.path.basename(path)):
            continue
        split = _SPLIT_PART.match(path)
        groups.setdefault(f"{split['stem']}-of-{split['count']}" if split else path, []).append(path)
    return [GgufModel(tuple(files)) for files in groups.values()]


def _tokens(text: str) -> list[str]:
    return _SEPARATOR.split(text.lower())


def names_quant(model: GgufModel, quant: str) -> bool:
    """Whether `quant`'s tokens are a run of the model name's tokens (any case)."""
    wanted, tokens = _tokens(quant), _tokens(model.name)
    return any(tokens[i : i + len(wanted)] == wanted for i in range(len(tokens) - len(wanted) + 1))


def choose_gguf(repo_files: list[str], repo_id: str, quant: str, what: str) -> GgufModel:
    """The one GGUF model of the repo `quant` (checked by check_quant) names. Raises ConfigError naming the
    candidates."""
    models = gguf_models(repo_files)
    matches = [model for model in models if names_quant(model, quant)]
    if len(matches) == 1:
        return matches[0]
    found = "none does" if not matches else f"{len(matches)} do: {', '.join(m.files[0] for m in matches)}"
    listed = ", ".join(m.files[0] for m in models) or "none"
    raise ConfigError(
        f"{what} {repo_id}:{quant} must name one GGUF file of the repo by its quantization, but {found} "
        f"(GGUF files: {listed}). The tag is matched against the file names as whole tokens, in any case "
        f"(Q4_0 is not Q4_0_4_4, F16 not BF16, XS not IQ4_XS): write it as they do ({repo_id}:Q4_K_M), "
        "with more of the name where several match (UD-Q4_K_XL)."
    )
