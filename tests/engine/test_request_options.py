"""RequestOptions: vLLM's keyword arguments build it; given both ways, the call is refused."""

import pytest

from pagedserve import SamplingParams
from pagedserve.engine.request_options import RequestOptions, request_options
from pagedserve.protocol import LoRARequest
from pagedserve.sampling_params import BeamSearchParams


def test_keywords_build_the_options_and_options_pass_as_they_are() -> None:
    params, beam, adapter = SamplingParams(n=2), BeamSearchParams(2, 4), LoRARequest("a", 1, "/a")
    built = request_options(params, beam_search=beam, priority=-3, lora_request=adapter, arrival_time=5.0)
    assert built == RequestOptions(params, beam, -3, adapter, 5.0)
    assert request_options(built) is built


@pytest.mark.parametrize(
    "keyword", [{"priority": 1}, {"beam_search": BeamSearchParams(2, 4)}, {"arrival_time": 1.0}]
)
def test_options_and_keywords_together_are_refused(keyword: dict) -> None:
    with pytest.raises(TypeError, match="set them in the RequestOptions"):
        request_options(RequestOptions(SamplingParams()), **keyword)
