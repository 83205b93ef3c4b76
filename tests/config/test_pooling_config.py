"""--runner, --convert and --pooler-config: what a pooling model resolves to, and each wrong setting a
ConfigError naming the flag."""

import json

import pytest

from pagedserve.config import EngineArgs
from pagedserve.errors import ConfigError


@pytest.fixture()
def bert_folder(tmp_path):
    from transformers import BertConfig

    BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    ).save_pretrained(tmp_path)
    return tmp_path


def _config(folder, **kwargs):
    return EngineArgs(model=str(folder), tokenizer=str(folder), **kwargs).create_engine_config()


def test_an_encoder_runs_on_the_pooling_runner_by_default(bert_folder) -> None:
    config = _config(bert_folder)
    pooling = config.model.pooling
    assert pooling is not None and pooling.task == "embed" and pooling.is_encoder
    assert (pooling.pooler.pooling_type, pooling.pooler.normalize) == ("CLS", True)
    assert config.scheduler.pooling and config.scheduler.max_num_batched_tokens >= config.model.max_model_len


def test_sentence_transformers_files_and_the_override(bert_folder) -> None:
    (bert_folder / "1_Pooling").mkdir()
    (bert_folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    modules = [{"path": "", "type": "sentence_transformers.models.Transformer"}]
    modules.append({"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    (bert_folder / "modules.json").write_text(json.dumps(modules))
    pooler = _config(bert_folder).model.pooling.pooler
    assert (pooler.pooling_type, pooler.normalize) == ("MEAN", False)  # no Normalize module
    pooler = _config(
        bert_folder, pooler_config='{"pooling_type": "last", "normalize": true}'
    ).model.pooling.pooler
    assert (pooler.pooling_type, pooler.normalize) == ("LAST", True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(runner="generate"), "is an encoder: it cannot generate. Use --runner pooling"),
        (dict(runner="both"), "--runner must be one of"),
        (dict(convert="rerank"), "--convert must be one of"),
        (dict(pooler_config="{"), "--pooler-config is not JSON"),
        (dict(pooler_config='{"pooling": "MEAN"}'), "--pooler-config must be a JSON object with keys among"),
        (dict(pooler_config='{"pooling_type": "MAX"}'), "pooling_type 'MAX' must be one of MEAN, CLS, LAST"),
        (dict(pooler_config='{"normalize": 1}'), "normalize and activation must be true or false"),
        (dict(pooler_config='{"classifier_from_token": "yes"}'), "one or two tokens"),
        (dict(convert="classify"), "--convert classify needs a classification head"),
        (
            dict(max_num_batched_tokens=32),
            "--max-num-batched-tokens \\(32\\) must be at least --max-model-len",
        ),
    ],
)
def test_wrong_settings_name_the_flag(bert_folder, kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(bert_folder, **kwargs)


def test_a_decoder_classifier_pools_its_last_token(tmp_path) -> None:
    from transformers import Qwen3Config

    Qwen3Config(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        num_labels=1,
        architectures=["Qwen3ForSequenceClassification"],
    ).save_pretrained(tmp_path)
    pooling = _config(tmp_path).model.pooling  # --runner auto: it has no LM head to generate with
    assert pooling is not None and pooling.task == "classify" and not pooling.is_encoder
    assert (pooling.pooler.pooling_type, pooling.num_labels) == ("LAST", 1)
    with pytest.raises(ConfigError, match="is a classifier \\(no LM head\\): it cannot generate"):
        _config(tmp_path, runner="generate")
