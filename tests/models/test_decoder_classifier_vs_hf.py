"""Decoders with HF's sequence-classification head (Llama/Qwen2/Qwen3 *ForSequenceClassification) on the
pooling runner: `LLM.classify` probabilities and `LLM.score` of (query, document) pairs equal HF
transformers' on the same random weights within 1e-4, batched and one at a time (HF's reference: one
right-padded batch). One label: a reranker's sigmoid score; three: softmax probabilities."""

import pytest
import torch
from conftest import build_tiny_decoder_classifier, hf_classifier_logits

from pagedserve import LLM

pytestmark = pytest.mark.slow  # engines on tiny models
QUERY = "what is the capital of france"
TEXTS = ["the cat is on the mat", "paris is the capital of france", "a", "dogs and cats " * 6]


# Qwen3's classifier: against HF through the server (tests/entrypoints/test_pooling_server.py).
@pytest.mark.parametrize("model_type,num_labels", [("llama", 1), ("qwen2", 3)], ids=["llama", "qwen2"])
def test_decoder_classifier_equals_hf(tmp_path, model_type: str, num_labels: int) -> None:
    from transformers import AutoTokenizer

    path = build_tiny_decoder_classifier(str(tmp_path), model_type, num_labels)
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = [tokenizer(t)["input_ids"] for t in TEXTS]
    pairs = [tokenizer(QUERY, t)["input_ids"] for t in TEXTS]
    single, paired = hf_classifier_logits(path, texts + pairs).split(len(TEXTS))
    expected = torch.sigmoid(single) if num_labels == 1 else torch.softmax(single, dim=-1)
    llm = LLM(path)  # --runner auto: a classifier has no LM head, so the pooling runner serves it
    try:
        assert llm.llm_engine.config.model.pooling.task == "classify"
        batched = torch.tensor([o.outputs.probs for o in llm.classify(TEXTS)])
        alone = torch.tensor([llm.classify(t)[0].outputs.probs for t in TEXTS])
        torch.testing.assert_close(batched, expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(alone, expected, atol=1e-4, rtol=0)
        if num_labels == 1:  # a reranker: the pair as the tokenizer joins it, scored by the head
            scores = [s.outputs.score for s in llm.score(QUERY, TEXTS)]
            assert scores == pytest.approx(torch.sigmoid(paired[:, 0]).tolist(), abs=1e-4)
            assert llm.score(QUERY, TEXTS[1])[0].outputs.score == pytest.approx(scores[1], abs=1e-4)
    finally:
        llm.llm_engine.client.shutdown()
