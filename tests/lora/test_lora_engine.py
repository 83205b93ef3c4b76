"""Multi-LoRA through the offline engine: every adapter of a mixed batch gives the greedy tokens of the
base model with that adapter merged into its weights (HF transformers), and the base model's requests in
the same batch give the base model's, with adapters evicted from their slots and from host memory on the
way (--max-loras, --max-cpu-loras)."""

import os
import shutil

import pytest
import torch
from conftest import hf_beam_search
from lora_adapters import ATTENTION, MLP, merge_adapter, write_adapter
from transformers import AutoConfig, AutoModelForCausalLM

from pagedserve import LLM, BeamSearchParams, SamplingParams
from pagedserve.lora.request import LoRARequest

PROMPTS = [
    [1, 5, 9, 200, 17, 44, 80, 3000, 12, 7, 99, 41, 5, 6, 7, 8, 9, 10, 11, 12],  # 20 tokens: a full block
    [1, 5, 9, 200, 17, 44, 80, 3000, 12, 7, 99, 41, 5, 6, 7, 8, 300, 301],  # shares that block's tokens
    [1, 7, 900, 33],
]
MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def hf_greedy(base: str, adapter: str | None, prompts: list[list[int]]) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        merge_adapter(model, adapter)
    return [
        model.generate(
            torch.tensor([p]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False
        )[0, len(p) :].tolist()
        for p in prompts
    ]


def make_adapters(folder: str, base: str) -> list[LoRARequest]:
    """Three adapters: every module (rank 8), q and v with rsLoRA (rank 4), the MLP only from a .bin."""
    config = AutoConfig.from_pretrained(base)
    paths = [
        write_adapter(os.path.join(folder, "all"), config, rank=8, alpha=16, seed=1),
        write_adapter(
            os.path.join(folder, "qv"), config, 4, 8, ("q_proj", "v_proj"), seed=2, use_rslora=True
        ),
        write_adapter(os.path.join(folder, "mlp"), config, 8, 4, MLP, seed=3, std=0.5),
    ]
    return [LoRARequest(os.path.basename(p), i + 1, p) for i, p in enumerate(paths)]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_mixed_batch_equals_merged_models(tiny_model_factory, tmp_path, family) -> None:
    """Three adapters and the base model over the same prompts (one shared prefix block: the prefix cache
    must not hand one adapter's K/V to another), all submitted at once with two slots and two adapters in
    host memory: the third waits for a slot, and one is read from disk again."""
    base = tiny_model_factory(family)
    adapters = make_adapters(str(tmp_path), base)
    llm = LLM(base, enable_lora=True, max_loras=2, max_cpu_loras=2, max_lora_rank=8, kv_cache_memory="8MiB")
    choices: list[LoRARequest | None] = [*adapters, None, adapters[0]]
    prompts = [p for _ in choices for p in PROMPTS]
    requests = [a for a in choices for _ in PROMPTS]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=requests)
    tokens = [o.outputs[0].token_ids for o in outputs]
    expected = {None: hf_greedy(base, None, PROMPTS)}
    for adapter in adapters:
        expected[adapter.lora_int_id] = hf_greedy(base, adapter.lora_path, PROMPTS)
        assert expected[adapter.lora_int_id] != expected[None], "the adapter must change the tokens"
    for i, adapter in enumerate(requests):
        key = None if adapter is None else adapter.lora_int_id
        assert tokens[i] == expected[key][i % len(PROMPTS)], (i, adapter)
    # One engine request per adapter afterwards: it still serves each of them right (slots reused).
    again = llm.generate(PROMPTS[2], GREEDY, use_tqdm=False, lora_request=adapters[1])
    assert again[0].outputs[0].token_ids == expected[2][2]


def test_beam_search_takes_an_adapter(tiny_model_factory, tmp_path) -> None:
    """LLM.beam_search(..., lora_request=) (vLLM's argument; one adapter, or one per prompt): the beams
    of the base model with the adapter merged in (HF's beam search). It took no adapter."""
    base = tiny_model_factory("llama")
    adapter = make_adapters(str(tmp_path), base)[0]
    llm = LLM(base, enable_lora=True, max_lora_rank=8, kv_cache_memory="8MiB")
    params = BeamSearchParams(beam_width=3, max_tokens=6)
    prompts = PROMPTS[1:]
    outputs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params, [adapter, None])
    beams = [[s.tokens[len(p) :] for s in o.sequences] for p, o in zip(prompts, outputs)]
    merged = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merge_adapter(merged, adapter.lora_path)
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    eos = llm.get_tokenizer().eos_token_id
    assert beams[0] == hf_beam_search(merged, prompts[0], params, eos)[0]
    assert beams[1] == hf_beam_search(plain, prompts[1], params, eos)[0]
    assert beams[0] != hf_beam_search(plain, prompts[0], params, eos)[0], "the adapter changes the beams"
    (alone,) = llm.beam_search({"prompt_token_ids": prompts[0]}, params, lora_request=adapter)
    assert [s.tokens[len(prompts[0]) :] for s in alone.sequences] == beams[0]


def test_adapter_on_a_quantized_gguf_base(tmp_path, monkeypatch) -> None:
    """A GGUF (Q8_0) base keeps its quantized matmuls; the adapter's delta is added in float beside them:
    tokens as HF's on the dequantized weights with the adapter merged (float activations: exact path)."""
    from conftest import build_tiny_model
    from gguf_writer import write_gguf

    monkeypatch.setenv("PAGEDSERVE_GGUF_ACTIVATION_BITS", "32")
    folder = build_tiny_model(str(tmp_path / "hf"), "llama")
    gguf = write_gguf(folder, "llama", str(tmp_path / "model.gguf"), "Q8_0")  # folder now dequantized
    (adapter,) = make_adapters(str(tmp_path), folder)[:1]
    llm = LLM(gguf, enable_lora=True, max_lora_rank=8, kv_cache_memory="8MiB")
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=adapter)
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy(folder, adapter.lora_path, PROMPTS)


def test_bad_adapters_are_refused_naming_the_problem(tiny_model_factory, tmp_path) -> None:
    """Nothing invalid reaches the engine: each is an error naming what is wrong and the limit; the engine
    serves the next request."""
    base = tiny_model_factory("llama")
    config = AutoConfig.from_pretrained(base)
    llm = LLM(base, enable_lora=True, max_lora_rank=8, kv_cache_memory="8MiB")
    cases = {
        "no such folder": str(tmp_path / "missing"),
        "above --max-lora-rank 8": write_adapter(str(tmp_path / "r16"), config, 16, 16),
        "modules_to_save": write_adapter(str(tmp_path / "save"), config, 4, 8, modules_to_save=["lm_head"]),
        "DoRA": write_adapter(str(tmp_path / "dora"), config, 4, 8, use_dora=True),
    }
    other = AutoConfig.from_pretrained(base)
    other.intermediate_size = 96  # an adapter of another model's shapes
    cases["do not fit the base model"] = write_adapter(str(tmp_path / "other"), other, 4, 8, MLP)
    for i, (message, path) in enumerate(cases.items()):
        with pytest.raises(ValueError, match=message):
            llm.generate(PROMPTS[2], GREEDY, use_tqdm=False, lora_request=LoRARequest(f"a{i}", i + 1, path))
    with pytest.raises(ValueError, match="--enable-lora"):
        LLM(base, kv_cache_memory="8MiB").generate(
            PROMPTS[2], GREEDY, use_tqdm=False, lora_request=LoRARequest("x", 1, cases["DoRA"])
        )
    good = write_adapter(str(tmp_path / "good"), config, 4, 8, ATTENTION)
    out = llm.generate(PROMPTS[2], GREEDY, use_tqdm=False, lora_request=LoRARequest("good", 99, good))
    assert out[0].outputs[0].token_ids == hf_greedy(base, good, [PROMPTS[2]])[0]


def test_tensor_parallel_shards_the_adapters(tiny_model_factory, tmp_path) -> None:
    """tp=2 (worker processes): each rank holds its shard of every adapter, B split by output rows beside
    q/k/v and gate/up, A split by input columns beside o and down (added before the all-reduce); each rank
    reads the adapter from disk itself. Tokens as HF's with the adapter merged."""
    base = tiny_model_factory("llama")
    adapters = make_adapters(str(tmp_path), base)[:2]
    llm = LLM(
        base, tensor_parallel_size=2, enable_lora=True, max_lora_rank=8, max_loras=2, kv_cache_memory="8MiB"
    )
    requests = [adapters[0], None, adapters[1]]
    outputs = llm.generate([PROMPTS[0]] * 3, GREEDY, use_tqdm=False, lora_request=requests)
    for output, adapter in zip(outputs, requests):
        path = None if adapter is None else adapter.lora_path
        assert output.outputs[0].token_ids == hf_greedy(base, path, [PROMPTS[0]])[0], adapter


def test_a_request_is_the_same_bits_beside_any_neighbours(tmp_path) -> None:
    """One request of adapter A alone, then beside a long prompt of A prefilled in chunks while it decodes
    (their tokens side by side in every step), a request of B and one of the base model: the same tokens
    and logprobs, to the bit. The base is a Q8_0 GGUF, whose kernels are batch invariant too (a float
    base's GEMM is not)."""
    from conftest import build_tiny_model
    from gguf_writer import write_gguf

    folder = build_tiny_model(str(tmp_path / "hf"), "llama")
    gguf = write_gguf(folder, "llama", str(tmp_path / "model.gguf"), "Q8_0")
    a, b = make_adapters(str(tmp_path), folder)[:2]
    llm = LLM(
        gguf,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
        max_num_batched_tokens=24,
        enable_prefix_caching=False,
        kv_cache_memory="8MiB",
    )
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    alone = llm.generate(PROMPTS[2], params, use_tqdm=False, lora_request=a)[0].outputs[0]
    long_prompt = [(17 * i) % 3000 + 3 for i in range(120)]
    prompts = [PROMPTS[2], long_prompt, PROMPTS[0], PROMPTS[1]]
    batch = llm.generate(prompts, params, use_tqdm=False, lora_request=[a, a, b, None])[0].outputs[0]
    assert batch.token_ids == alone.token_ids
    assert batch.logprobs == alone.logprobs


def test_adapter_files_gone_or_rewritten_fail_their_requests_only(tiny_model_factory, tmp_path) -> None:
    """--max-loras 1, --max-cpu-loras 1: v, then w (v leaves host memory), then v again after its folder
    was deleted, then after it was rewritten with other weights of the same shapes. Each time v's request
    ends with an error naming the folder and the problem; the engine serves w and the base model after."""
    base = tiny_model_factory("llama")
    config = AutoConfig.from_pretrained(base)
    v_path, w_path = str(tmp_path / "v"), str(tmp_path / "w")
    v = LoRARequest("v", 1, write_adapter(v_path, config, 4, 8, ATTENTION, seed=1))
    w = LoRARequest("w", 2, write_adapter(w_path, config, 4, 8, ATTENTION, seed=2))
    llm = LLM(base, enable_lora=True, max_lora_rank=8, max_cpu_loras=1, kv_cache_memory="8MiB")
    first_v = llm.generate(PROMPTS[0], GREEDY, use_tqdm=False, lora_request=v)[0].outputs[0].token_ids
    expected_w = hf_greedy(base, w_path, [PROMPTS[0]])[0]
    expected_base = hf_greedy(base, None, [PROMPTS[0]])[0]
    for change, problem in (
        (lambda: shutil.rmtree(v_path), "no such folder"),
        (
            lambda: write_adapter(v_path, config, 4, 8, ATTENTION, seed=3),
            "its files changed since it was loaded",
        ),
    ):
        assert llm.generate(PROMPTS[0], GREEDY, use_tqdm=False, lora_request=w)[0].outputs[0].token_ids == (
            expected_w
        )
        change()
        failed = llm.generate(PROMPTS[0], GREEDY, use_tqdm=False, lora_request=v)[0]
        assert failed.error is not None and v_path in failed.error and problem in failed.error
        assert failed.outputs[0].finish_reason == "error"
        outputs = llm.generate([PROMPTS[0]] * 2, GREEDY, use_tqdm=False, lora_request=[w, None])
        assert [o.outputs[0].token_ids for o in outputs] == [expected_w, expected_base]
    assert first_v != expected_w
