"""The pooling runner against the references: sentence-transformers' `encode` (BERT with mean pooling and
Normalize, a Llama with last-token pooling) and HF transformers' cross-encoder logits, batched and one at
a time, within 1e-4."""

import os

import pytest
import torch

from pagedserve import LLM
from pagedserve.engine.pooling_input import PoolingOptions
from pagedserve.errors import InvalidRequestError

TEXTS = [
    "the cat is on the mat",
    "paris is the capital of france",
    "what is the weather like in paris",
    "a",
    "dogs and cats were there when we had water " * 3,
]


def _st_encode(path: str, texts: list[str]) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu")
    return torch.tensor(model.encode(texts, batch_size=len(texts)))


@pytest.fixture(scope="module")
def bert_llm(tiny_bert_embedder: str):
    llm = LLM(tiny_bert_embedder, max_num_seqs=8)
    yield llm
    llm.llm_engine.client.shutdown()


def _assert_close(ours: list[list[float]], reference: torch.Tensor) -> None:
    got = torch.tensor(ours)
    assert got.shape == reference.shape
    torch.testing.assert_close(got, reference.float(), atol=1e-4, rtol=0)
    cosines = torch.nn.functional.cosine_similarity(got, reference.float(), dim=-1)
    assert cosines.min() > 0.9999


def test_bert_embeddings_equal_sentence_transformers(bert_llm: LLM, tiny_bert_embedder: str) -> None:
    reference = _st_encode(tiny_bert_embedder, TEXTS)
    batched = bert_llm.embed(TEXTS)
    _assert_close([o.outputs.embedding for o in batched], reference)
    one_by_one = [bert_llm.embed(text)[0].outputs.embedding for text in TEXTS]
    _assert_close(one_by_one, reference)
    assert all(abs(sum(x * x for x in v) - 1) < 1e-5 for v in one_by_one)  # 2_Normalize


def test_bfloat16_bert_embeddings_are_bfloat16_close(tiny_bert_embedder: str) -> None:
    """--dtype bfloat16 (its GEMMs are 4x float32's on AVX-512 BF16 CPUs): within bfloat16's rounding of
    the float32 reference, as close as sentence-transformers' own bfloat16 model gets."""
    from sentence_transformers import SentenceTransformer

    reference = _st_encode(tiny_bert_embedder, TEXTS)
    st_bf16 = SentenceTransformer(
        tiny_bert_embedder, device="cpu", model_kwargs={"torch_dtype": torch.bfloat16}
    )
    peer = st_bf16.encode(TEXTS, batch_size=len(TEXTS), convert_to_tensor=True).float()
    llm = LLM(tiny_bert_embedder, max_num_seqs=8, dtype="bfloat16")
    try:
        ours = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS)])
    finally:
        llm.llm_engine.client.shutdown()
    cosine = torch.nn.functional.cosine_similarity
    peer_error = (1 - cosine(peer, reference, dim=-1)).max().item()
    assert (1 - cosine(ours, reference, dim=-1)).max().item() <= max(2 * peer_error, 1e-4)
    assert cosine(ours, reference, dim=-1).min() > 0.999


def test_llama_last_token_embeddings_equal_sentence_transformers(tiny_llama_embedder: str) -> None:
    llm = LLM(tiny_llama_embedder, runner="pooling")
    try:
        reference = _st_encode(tiny_llama_embedder, TEXTS)
        _assert_close([o.outputs.embedding for o in llm.embed(TEXTS)], reference)
        _assert_close([llm.embed(t)[0].outputs.embedding for t in TEXTS], reference)
    finally:
        llm.llm_engine.client.shutdown()


def test_cross_encoder_scores_equal_hf(tiny_bert_cross_encoder: str) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    hf = AutoModelForSequenceClassification.from_pretrained(tiny_bert_cross_encoder).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_cross_encoder)
    query, docs = "what is the capital of france", TEXTS
    with torch.no_grad():
        encoded = tokenizer([query] * len(docs), docs, padding=True, return_tensors="pt")
        reference = torch.sigmoid(hf(**encoded).logits[:, 0])
    llm = LLM(tiny_bert_cross_encoder)
    try:
        scores = [s.outputs.score for s in llm.score(query, docs)]
        torch.testing.assert_close(torch.tensor(scores), reference, atol=1e-4, rtol=0)
        one = llm.score(query, docs[1])[0].outputs.score
        assert abs(one - reference[1].item()) < 1e-4
        with pytest.raises(InvalidRequestError, match="serves the classify task"):
            llm.embed("a")
    finally:
        llm.llm_engine.client.shutdown()


def test_score_with_an_embedding_model_is_the_cosine(bert_llm: LLM) -> None:
    vectors = torch.tensor([o.outputs.embedding for o in bert_llm.embed(TEXTS[:3])])
    scores = [s.outputs.score for s in bert_llm.score(TEXTS[0], TEXTS[1:3])]
    expected = (vectors[1:3] @ vectors[0]).tolist()
    assert scores == pytest.approx(expected, abs=1e-5)


def test_limits_and_options(bert_llm: LLM, tiny_bert_embedder: str) -> None:
    long_text = "the cat " * 200
    with pytest.raises(
        InvalidRequestError, match="maximum context length is 128 tokens.*truncate_prompt_tokens"
    ):
        bert_llm.embed(long_text)
    truncated = bert_llm.embed(long_text, PoolingOptions(truncate_prompt_tokens=16))[0]
    assert len(truncated.prompt_token_ids) == 16
    assert truncated.prompt_token_ids[-1] == bert_llm.get_tokenizer().sep_token_id  # cut by the tokenizer
    # Cut to the context length as sentence-transformers cuts a long text (max_seq_length 128).
    whole = bert_llm.embed(long_text, PoolingOptions(truncate_prompt_tokens=-1))[0].outputs.embedding
    _assert_close([whole], _st_encode(tiny_bert_embedder, [long_text]))
    ids = bert_llm.embed({"prompt_token_ids": list(range(5, 300))}, PoolingOptions(truncate_prompt_tokens=-1))
    assert ids[0].prompt_token_ids == list(range(5, 133))  # token ids: the first 128 as given
    with pytest.raises(InvalidRequestError, match="does not support dimensions"):
        bert_llm.embed("a", PoolingOptions(dimensions=8))
    with pytest.raises(InvalidRequestError, match="serves the embed task"):
        bert_llm.classify("a")
    with pytest.raises(InvalidRequestError, match="pooling runner"):
        bert_llm.generate("a")
    raw = bert_llm.embed("the cat", PoolingOptions(normalize=False))[0].outputs.embedding
    assert abs(sum(x * x for x in raw) - 1) > 1e-3
    with pytest.raises(InvalidRequestError, match="normalize must be true or false, got 'no'"):
        bert_llm.embed("the cat", PoolingOptions(normalize="no"))  # was read as true
    # The model's named prompt prefix (config_sentence_transformers.json), as sentence-transformers adds it.
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(tiny_bert_embedder, device="cpu").encode(["the cat"], prompt_name="query")
    ours = bert_llm.embed("the cat", PoolingOptions(prompt_name="query"))[0].outputs.embedding
    _assert_close([ours], torch.tensor(reference))


def test_matryoshka_dimensions(tiny_bert_embedder: str, tmp_path) -> None:
    import json
    import shutil

    folder = shutil.copytree(tiny_bert_embedder, tmp_path / "mrl")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [16, 32, 64]}))
    llm = LLM(str(folder))
    try:
        full = torch.tensor(llm.embed("the cat", PoolingOptions(normalize=False))[0].outputs.embedding)
        short = llm.embed("the cat", PoolingOptions(dimensions=16))[0].outputs.embedding
        assert len(short) == 16
        _assert_close([short], torch.nn.functional.normalize(full[:16], dim=0)[None])
        with pytest.raises(InvalidRequestError, match="use one of 16, 32, 64"):
            llm.embed("a", PoolingOptions(dimensions=20))
    finally:
        llm.llm_engine.client.shutdown()


@pytest.mark.parametrize("head", [False, True], ids=["encoder", "cross-encoder"])
def test_roberta_equals_hf(tiny_bert_embedder: str, tmp_path, head: bool) -> None:
    """RoBERTa / XLM-RoBERTa (bge, e5, bge-reranker): positions after the padding index, one token type,
    the classifier's dense + out_proj head; CLS pooling by default."""
    import shutil

    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaModel

    config = XLMRobertaConfig(
        vocab_size=200,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=66,
        pad_token_id=1,
        type_vocab_size=1,
        num_labels=1,
    )
    torch.manual_seed(0)
    hf = (XLMRobertaForSequenceClassification if head else XLMRobertaModel)(config).eval()
    hf.save_pretrained(tmp_path)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src := os.path.join(tiny_bert_embedder, name)) and os.path.exists(src):
            shutil.copy(src, tmp_path)
    prompts = [[0, 50, 60, 70, 2], [0, 99, 2], list(range(3, 67))]
    llm = LLM(str(tmp_path), max_model_len=64)
    try:
        with torch.no_grad():
            if head:
                expected = [torch.sigmoid(hf(torch.tensor([p])).logits[0]) for p in prompts]
            else:
                expected = [
                    torch.nn.functional.normalize(hf(torch.tensor([p])).last_hidden_state[0, 0], dim=0)
                    for p in prompts
                ]
        got = llm.encode([{"prompt_token_ids": p} for p in prompts])
        _assert_close([o.outputs.data for o in got], torch.stack(expected))
    finally:
        llm.llm_engine.client.shutdown()


def test_pooler_config_overrides_the_model(tiny_bert_embedder: str) -> None:
    """--pooler-config over sentence-transformers' files: CLS, not normalized, equals HF's CLS state."""
    from transformers import AutoModel, AutoTokenizer

    llm = LLM(tiny_bert_embedder, pooler_config='{"pooling_type": "CLS", "normalize": false}')
    try:
        hf = AutoModel.from_pretrained(tiny_bert_embedder).eval()
        ids = AutoTokenizer.from_pretrained(tiny_bert_embedder)(TEXTS[1], return_tensors="pt")
        with torch.no_grad():
            expected = hf(**ids).last_hidden_state[0, 0]
        _assert_close([llm.embed(TEXTS[1])[0].outputs.embedding], expected[None])
    finally:
        llm.llm_engine.client.shutdown()


def test_a_bare_decoder_checkpoint_embeds(tiny_llama: str, tmp_path) -> None:
    """Qwen3-Embedding's layout: the bare model's tensors (no `model.` prefix, no lm_head) under a
    *ForCausalLM config; last-token pooling, normalized, equals HF's last hidden state."""
    import json
    import shutil

    from transformers import AutoModel

    hf = AutoModel.from_pretrained(tiny_llama).eval()  # LlamaModel: saves without the prefix
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    for name in os.listdir(tiny_llama):
        if name.startswith("tokenizer") or name.startswith("special_tokens"):
            shutil.copy(os.path.join(tiny_llama, name), tmp_path)
    llm = LLM(str(tmp_path), runner="pooling")
    try:
        prompts = [[1, 5, 9, 300], [1, 77]]
        with torch.no_grad():
            expected = [
                torch.nn.functional.normalize(hf(torch.tensor([p])).last_hidden_state[0, -1], dim=0)
                for p in prompts
            ]
        got = llm.embed([{"prompt_token_ids": p} for p in prompts])
        _assert_close([o.outputs.embedding for o in got], torch.stack(expected))
    finally:
        llm.llm_engine.client.shutdown()


def test_a_decoder_gguf_embeds(default_model: str) -> None:
    """A GGUF decoder (the default SmolLM2) on the pooling runner: last token, normalized vectors of
    its hidden size, the same batched and alone."""
    llm = LLM(default_model, runner="pooling", max_model_len=256)
    try:
        batched = [o.outputs.embedding for o in llm.embed(TEXTS[:3])]
        alone = [llm.embed(t)[0].outputs.embedding for t in TEXTS[:3]]
        assert len(batched[0]) == llm.llm_engine.config.model.hf_config.hidden_size
        _assert_close(batched, torch.tensor(alone))
        assert all(abs(sum(x * x for x in v) - 1) < 1e-5 for v in batched)
    finally:
        llm.llm_engine.client.shutdown()


def test_a_decoder_reranker_scores_by_its_classifier_tokens(tiny_llama: str) -> None:
    """Qwen3-Reranker's way (vLLM's classifier_from_token): sigmoid(logit(yes) - logit(no)) at the last
    token, from the LM head, equal to HF's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    no, yes = (tokenizer.encode(t, add_special_tokens=False)[0] for t in ("no", "yes"))
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    llm = LLM(
        tiny_llama,
        runner="pooling",
        convert="classify",
        pooler_config='{"classifier_from_token": ["no", "yes"]}',
    )
    try:
        scores = [s.outputs.score for s in llm.score("is paris in france", ["yes it is", "the cat sat", "a"])]
        expected = []
        for doc in ["yes it is", "the cat sat", "a"]:
            ids = tokenizer("is paris in france", doc)["input_ids"]
            with torch.no_grad():
                logits = hf(torch.tensor([ids])).logits[0, -1]
            expected.append(torch.sigmoid(logits[yes] - logits[no]).item())
        assert scores == pytest.approx(expected, abs=1e-4)
    finally:
        llm.llm_engine.client.shutdown()


def test_tensor_parallel_pooling_equals_sentence_transformers(
    tiny_bert_embedder: str, tiny_bert_cross_encoder: str
) -> None:
    """tp=2 (worker processes): the encoder's heads and MLP split over two ranks, pooled on rank 0; the
    embeddings as sentence-transformers', and a cross-encoder's scores as at tp=1."""
    llm = LLM(tiny_bert_embedder, tensor_parallel_size=2, max_num_seqs=8)
    try:
        _assert_close([o.outputs.embedding for o in llm.embed(TEXTS)], _st_encode(tiny_bert_embedder, TEXTS))
    finally:
        llm.llm_engine.client.shutdown()
    scores = {}
    for tp in (1, 2):
        llm = LLM(tiny_bert_cross_encoder, tensor_parallel_size=tp)
        try:
            scores[tp] = [o.outputs.score for o in llm.score(TEXTS[1], TEXTS)]
        finally:
            llm.llm_engine.client.shutdown()
    assert scores[2] == pytest.approx(scores[1], abs=1e-4)
