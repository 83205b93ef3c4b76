"""Images in the scheduler: the encoder's share of a step (core/encoder_budget.py: a chunk is cut before an
image that would take the step past --max-num-batched-tokens image tokens, an image larger than the budget
still runs, in a step of its own), a family whose image tokens attend each other both ways (Gemma 3) gets
each image whole in one chunk, image blocks' prefix-cache hashes include the image, and n-gram drafts stop
before an image placeholder."""

import time
from dataclasses import replace

from utils import make_scheduler

from pagedserve.core.hashing import extend_block_hashes
from pagedserve.core.request import Request
from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.core.spec_decode import before_image_placeholders
from pagedserve.protocol import EngineCoreRequest, ImageInput
from pagedserve.sampling_params import SamplingParams

IMAGE = 7


def image(offset: int, length: int, name: str) -> ImageInput:
    return ImageInput(name * 64, offset, length, [1, 3, 2, 2], b"")


def image_request(request_id: str, num_tokens: int, images: list[ImageInput]) -> Request:
    tokens = list(range(100, 100 + num_tokens))
    for placed in images:
        tokens[placed.offset : placed.offset + placed.length] = [IMAGE] * placed.length
    params = SamplingParams(max_tokens=2)
    return Request(EngineCoreRequest(request_id, tokens, params, None, time.time(), images=images))


def scheduled_steps(scheduler, steps: int) -> list[dict[str, int]]:
    seen = []
    for _ in range(steps):
        out = scheduler.schedule()
        seen.append(dict(out.num_scheduled_tokens))
        scheduler.update_from_output(out, ModelRunnerOutput({}))
    return seen


def test_a_chunk_stops_before_an_image_past_the_encoder_budget() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64)
    scheduler.add_request(image_request("a", 95, [image(10, 40, "a"), image(50, 40, "b")]))
    # Step 1 may start the first image (40 encoder tokens) but not the second (80 > 64): cut at 50.
    assert scheduled_steps(scheduler, 2) == [{"a": 50}, {"a": 45}]


def test_the_second_request_waits_for_the_next_steps_encoder_budget() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64)
    scheduler.add_request(image_request("a", 45, [image(4, 40, "a")]))
    scheduler.add_request(image_request("b", 40, [image(2, 30, "b")]))
    first, second = scheduled_steps(scheduler, 2)
    assert first == {"a": 45, "b": 2}  # b's image would make 70 encoder tokens in the step: it waits
    assert second == {"b": 38}


def test_an_image_larger_than_the_budget_runs_alone() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64)
    scheduler.add_request(image_request("a", 110, [image(0, 100, "a")]))
    assert scheduled_steps(scheduler, 2) == [{"a": 64}, {"a": 46}]


def test_whole_images_are_never_cut() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=24, block_size=8)
    scheduler.config = replace(scheduler.config, whole_image_tokens=16)
    scheduler.add_request(image_request("a", 40, [image(10, 16, "a")]))
    # A 24-token chunk would end inside the image (10-25): it stops before it, the next holds it whole.
    assert scheduled_steps(scheduler, 3) == [{"a": 10}, {"a": 24}, {"a": 6}]
    # The same prompt start after a prefix hit of three blocks (24 tokens: inside the image): the rest of
    # the image and of the prompt in one chunk.
    scheduler.add_request(image_request("b", 30, [image(10, 16, "a")]))
    assert scheduled_steps(scheduler, 1) == [{"b": 6}]


def test_block_hashes_include_the_image() -> None:
    tokens = [1] * 8 + [IMAGE] * 8 + [2] * 8
    hashes = {}
    for name in "ab":
        hashes[name] = []
        extend_block_hashes(hashes[name], tokens, 8, 3, None, b"", [image(8, 8, name)])
    assert hashes["a"][0] == hashes["b"][0]  # the text before the image
    assert hashes["a"][1] != hashes["b"][1] and hashes["a"][2] != hashes["b"][2]


def test_drafts_stop_before_an_image_placeholder() -> None:
    request = image_request("a", 30, [image(4, 8, "a")])
    assert before_image_placeholders(request, [5, 6, IMAGE, IMAGE]) == [5, 6]
    assert before_image_placeholders(request, [5, 6]) == [5, 6]
