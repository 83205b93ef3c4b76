"""A request's bad input fails that request only: on a real engine process (AsyncLLM over MPClient), a
request the engine cannot decode, one it cannot take, malformed frames on its socket and a request that
cannot be encoded each fail at most their own caller, at once; the engine goes on serving the others."""

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import msgspec
import pytest

from pagedserve import SamplingParams
from pagedserve.config import EngineArgs
from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.engine.request_options import RequestOptions
from pagedserve.engine.request_stream import RequestStream
from pagedserve.errors import RequestFailedError
from pagedserve.protocol import EngineCoreRequest, EngineCoreRequestType
from pagedserve.sampling_params import BeamSearchParams

MAX_TOKENS = 6
PROMPT = {"prompt_token_ids": list(range(10, 30))}
WAIT_S = 60.0  # bounds every wait; a request that fails does so in well under a second


@pytest.fixture(scope="module")
def engine(tiny_llama: str) -> Iterator[tuple[asyncio.AbstractEventLoop, AsyncLLM]]:
    config = EngineArgs(model=tiny_llama, block_size=8, kv_cache_memory="8MiB").create_engine_config()
    loop = asyncio.new_event_loop()
    # The current loop: these tests submit from outside it, and zmq's sockets look the loop up then (an
    # earlier test's asyncio.run leaves none current).
    asyncio.set_event_loop(loop)
    llm = loop.run_until_complete(AsyncLLM.create(config, [], log_requests=False))
    yield loop, llm

    async def shutdown() -> None:
        llm.shutdown()
        await asyncio.gather(*llm._tasks, return_exceptions=True)

    loop.run_until_complete(shutdown())
    loop.close()
    asyncio.set_event_loop(None)


def good_request(llm: AsyncLLM, request_id: str, **params: object) -> EngineCoreRequest:
    sampling = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, **params)
    return llm.process_inputs(request_id, PROMPT, RequestOptions(sampling))


async def final_output(stream: RequestStream) -> list[int]:
    """The token ids of the request's one sample, once it finished with 'length'."""
    outputs = [output async for output in stream]
    assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "length", outputs[-1]
    return outputs[-1].outputs[0].token_ids


async def failure(stream: RequestStream) -> tuple[str, float]:
    """The error the stream raises and how long it took."""
    start = time.monotonic()
    with pytest.raises(RequestFailedError) as info:
        async for _ in stream:
            pass
    return str(info.value), time.monotonic() - start


def check_still_serving(loop: asyncio.AbstractEventLoop, llm: AsyncLLM, request_id: str) -> None:
    """The engine process lives, a new request completes, and nothing of the failed ones is left."""
    assert llm.engine_core.is_alive() and not llm.errored
    (stream,) = llm.submit([good_request(llm, request_id)])
    tokens = loop.run_until_complete(asyncio.wait_for(final_output(stream), WAIT_S))
    assert len(tokens) == MAX_TOKENS
    assert llm.frontend.output_processor.num_unfinished == 0 and not llm.admission.queued
    assert not llm._streams


def test_undecodable_request_fails_alone_in_its_batch(engine: tuple) -> None:
    loop, llm = engine
    # NOTE: the wrong types go through the real encoder and socket; only the engine's decoder sees them.
    undecodable = msgspec.structs.replace(good_request(llm, "bad-salt"), cache_salt=123)
    samples = msgspec.structs.replace(good_request(llm, "bad-samples", n=2), eos_token_id="eos")
    beam_search = RequestOptions(SamplingParams(max_tokens=MAX_TOKENS, n=2), BeamSearchParams(2, MAX_TOKENS))
    beams = llm.process_inputs("bad-beams", PROMPT, beam_search)
    beams = msgspec.structs.replace(beams, eos_token_id="eos")  # fails under the search's own id
    batch = [good_request(llm, "ok-1"), undecodable, samples, beams, good_request(llm, "ok-2")]
    streams = llm.submit(batch)

    async def run() -> list:
        return await asyncio.gather(
            *(final_output(s) if s.request_id.startswith("ok") else failure(s) for s in streams)
        )

    results = loop.run_until_complete(asyncio.wait_for(run(), WAIT_S))
    for (message, elapsed), request in zip(results[1:4], batch[1:4]):
        assert request.request_id.split("-")[0] == "bad"
        assert f"could not run request {request.request_id}" in message and "could not be decoded" in message
        assert elapsed < 10, f"{request.request_id} failed after {elapsed:.1f} s"
    assert "Expected `str | null`, got `int` - at `cache_salt`" in results[1][0]
    assert "at `eos_token_id`" in results[2][0] and "at `eos_token_id`" in results[3][0]
    assert results[0] == results[4] and len(results[0]) == MAX_TOKENS  # the same prompt, greedy
    check_still_serving(loop, llm, "after-decode")


def test_request_the_engine_cannot_take_fails_alone(engine: tuple) -> None:
    loop, llm = engine
    # NOTE: decodes fine, but the engine's Request refuses an unresolved max_tokens (the frontend's job).
    unresolved = good_request(llm, "bad-max-tokens")
    params = dataclasses.replace(unresolved.sampling_params, max_tokens=None)
    batch = [
        good_request(llm, "take-1"),
        msgspec.structs.replace(unresolved, sampling_params=params),
        good_request(llm, "take-2"),
        good_request(llm, "take-3"),
    ]
    streams = llm.submit(batch)

    async def run() -> list:
        return await asyncio.gather(
            final_output(streams[0]), failure(streams[1]), *map(final_output, streams[2:])
        )

    first, (message, elapsed), *others = loop.run_until_complete(asyncio.wait_for(run(), WAIT_S))
    assert "could not run request bad-max-tokens" in message and "max_tokens is resolved" in message
    assert elapsed < 10
    assert all(tokens == first for tokens in others) and len(first) == MAX_TOKENS
    check_still_serving(loop, llm, "after-take")


def test_malformed_frames_are_dropped(engine: tuple) -> None:
    loop, llm = engine
    socket = llm.engine_core._input_socket  # the real socket to the engine process
    add, abort = EngineCoreRequestType.ADD.value, EngineCoreRequestType.ABORT.value
    encode = msgspec.msgpack.encode
    frames = [
        [add, b"\xc1"],  # not msgpack at all
        [add, encode({"not": "a list"})],
        [add, encode([[7, 8, 9], "x"])],  # requests without a readable id
        [add, encode([])],
        [abort, encode([1, 2])],
        [b"\x09", b""],  # an unknown type
        [add],  # no payload
    ]
    for message in frames:
        socket.send_multipart(message)
    loop.run_until_complete(asyncio.sleep(0.5))  # the engine reads them before the next request
    check_still_serving(loop, llm, "after-frames")


def test_unencodable_request_fails_in_the_caller(engine: tuple) -> None:
    loop, llm = engine
    for salt in (object(), 2**64):
        bad = msgspec.structs.replace(good_request(llm, "reused-id"), cache_salt=salt)
        with pytest.raises(RequestFailedError, match="reused-id could not be encoded"):
            llm.submit([good_request(llm, "with-it"), bad])
        # nothing of the refused batch is left: its ids are free again
        assert llm.frontend.output_processor.num_unfinished == 0 and not llm.admission.queued
    check_still_serving(loop, llm, "reused-id")


LEFT_RUNNING = """
import asyncio, sys
from pagedserve.config import EngineArgs
from pagedserve.engine.async_llm import AsyncLLM

config = EngineArgs(model=sys.argv[1], block_size=8, kv_cache_memory="8MiB").create_engine_config()
asyncio.run(AsyncLLM.create(config, [], log_requests=False))  # never shut down: atexit does it
"""


def test_an_engine_left_running_stops_at_exit_without_an_event_loop(tiny_llama: str) -> None:
    """A script that leaves its AsyncLLM running: at exit, with its event loop gone, the engine process is
    still asked to stop (it used to raise in the atexit hook, then wait out the timeout and terminate)."""
    result = subprocess.run(
        [sys.executable, "-c", LEFT_RUNNING, tiny_llama],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert result.returncode == 0, result.stderr
    assert "Exception ignored" not in result.stderr and "terminating it" not in result.stderr, result.stderr
