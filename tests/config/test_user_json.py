"""User JSON given as text or already parsed (utils/user_json.py), read the same way by
--speculative-config and structured_outputs.json, each error naming its own field."""

import json

import pytest

from pagedserve.config.speculative import SpeculativeConfig
from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.structured_outputs_params import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize("text", ["", "{", "{not json", '{"type": "object",}', "NaN-ish", "\x00"])
def test_bad_text_names_the_field(text: str) -> None:
    with pytest.raises(
        InvalidRequestError, match=r"structured_outputs\.json is not a valid JSON schema"
    ) as caught:
        StructuredOutputsParams(json=text)
    assert caught.value.param == "structured_outputs.json"
    with pytest.raises(ConfigError, match="--speculative-config is not valid JSON"):
        SpeculativeConfig.from_user(text)


def test_text_and_parsed_values_are_the_same_constraint() -> None:
    from_text = StructuredOutputsParams(json=json.dumps(SCHEMA))
    from_dict = StructuredOutputsParams(json=SCHEMA)
    assert from_text.json == SCHEMA and from_text.spec == from_dict.spec
    assert SpeculativeConfig.from_user('{"method": "ngram", "num_speculative_tokens": 3}') == (
        SpeculativeConfig.from_user({"method": "ngram", "num_speculative_tokens": 3})
    )
