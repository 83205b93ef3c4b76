"""llama.cpp's BERT embedding GGUFs (arch "bert", which transformers cannot read): the config, WordPiece
tokenizer and pooling type rebuilt from the file's metadata, and embeddings equal sentence-transformers'
on the same weights (mean pooling + Normalize) within 1e-4: F16 tensors, and Q8_0 (the values the file
holds, written back into the HF folder) on float activations."""

import shutil

import pytest
import torch
from gguf_writer import write_bert_gguf

from pagedserve import LLM
from pagedserve.config import EngineArgs
from pagedserve.errors import ConfigError

TEXTS = ["the cat is on the mat", "paris is the capital of france", "a", "dogs and cats were there " * 3]


@pytest.mark.slow
@pytest.mark.parametrize("quant_type", ["F16", "Q8_0"])
def test_bert_gguf_embeddings_equal_sentence_transformers(
    tiny_bert_embedder: str, tmp_path, monkeypatch, quant_type: str
) -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    # Exact float32 activations, as HF computes (the GGUF kernels' integer blocks: tests/quantization).
    monkeypatch.setenv("PAGEDSERVE_GGUF_ACTIVATION_BITS", "32")
    folder = str(shutil.copytree(tiny_bert_embedder, tmp_path / "hf"))  # rewritten with the file's values
    path = write_bert_gguf(folder, str(tmp_path / "bert.gguf"), quant_type)
    expected = torch.tensor(SentenceTransformer(folder, device="cpu").encode(TEXTS))
    llm = LLM(path)  # --runner auto: an encoder; pooling from bert.pooling_type (mean), normalized
    try:
        ours = llm.get_tokenizer()
        original = AutoTokenizer.from_pretrained(folder)
        assert [ours.encode(t) for t in TEXTS] == [original.encode(t) for t in TEXTS]
        assert llm.llm_engine.config.model.quantization == "gguf"
        batched = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS)])
        alone = torch.tensor([llm.embed(t)[0].outputs.embedding for t in TEXTS])
        torch.testing.assert_close(batched, expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(alone, expected, atol=1e-4, rtol=0)
    finally:
        llm.llm_engine.client.shutdown()


def test_bert_gguf_pooling_type_sets_the_pooler(tiny_bert_embedder: str, tmp_path) -> None:
    """bert.pooling_type 2 (CLS) is the pooler, normalized; a reranker GGUF (4, RANK) is refused."""
    folder = str(shutil.copytree(tiny_bert_embedder, tmp_path / "hf"))
    cls = write_bert_gguf(folder, str(tmp_path / "cls.gguf"), pooling_type=2)
    pooling = EngineArgs(model=cls).create_engine_config().model.pooling
    assert pooling is not None and pooling.is_encoder
    assert (pooling.pooler.pooling_type, pooling.pooler.normalize) == ("CLS", True)
    rank = write_bert_gguf(folder, str(tmp_path / "rank.gguf"), pooling_type=4)
    with pytest.raises(ConfigError, match="pooling type is RANK .* serve the reranker's HF folder"):
        EngineArgs(model=rank).create_engine_config()
