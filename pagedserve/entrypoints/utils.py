"""Async helpers for the server: merging output streams, and cancelling a handler whose client left."""

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import ParamSpec, Protocol, TypeVar, cast

from starlette.requests import Request

T = TypeVar("T")
P = ParamSpec("P")
T_co = TypeVar("T_co", covariant=True)


class ClosableAsyncIterator(Protocol[T_co]):
    """An async iterator that can be closed early: an async generator, or AsyncLLM's RequestStream."""

    def __aiter__(self) -> AsyncIterator[T_co]: ...

    async def __anext__(self) -> T_co: ...

    async def aclose(self) -> None: ...


async def merge_async_iterators(
    *iterators: ClosableAsyncIterator[T],
) -> AsyncGenerator[tuple[int, T], None]:
    """Items of all `iterators` as they come, tagged with the iterator's index. When this generator is
    closed or cancelled early, every source is closed too (a RequestStream: its request aborted)."""
    if len(iterators) == 1:
        try:
            async for item in iterators[0]:
                yield 0, item
        finally:
            await iterators[0].aclose()
        return
    pending = {asyncio.ensure_future(anext(it)): index for index, it in enumerate(iterators)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                index = pending.pop(future)
                try:
                    item = future.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(iterators[index]))] = index
                yield index, item
    finally:
        for future in pending:
            future.cancel()
        # NOTE: wait for the cancelled steps, so each source has run its cleanup (abort) before we return.
        await asyncio.gather(*pending, return_exceptions=True)
        for iterator in iterators:
            with contextlib.suppress(Exception):
                await iterator.aclose()


async def started(iterator: ClosableAsyncIterator[T]) -> AsyncGenerator[T, None]:
    """Run `iterator` up to its first item now, and return a generator of all its items. For streamed
    responses: a refusal before the first output (a full queue, the queue time, a dead engine) is then
    raised here, before the response starts, and becomes an HTTP status instead of an error event in
    a 200 stream. Closing the returned generator closes `iterator`."""
    try:
        head = [await anext(iterator)]
    except StopAsyncIteration:
        head = []
    except BaseException:
        await iterator.aclose()
        raise

    async def chained() -> AsyncGenerator[T, None]:
        try:
            for item in head:
                yield item
            async for item in iterator:
                yield item
        finally:
            await iterator.aclose()

    return chained()


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def with_cancellation(handler: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T | None]]:
    """Run a route handler, cancelling it as soon as its client disconnects (so a non-streamed request
    stops using the engine at once). The handler must take the starlette Request as `raw_request`.
    Streamed responses need no wrapper: starlette cancels them on a disconnect itself."""

    @functools.wraps(handler)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T | None:
        raw_request = cast(Request, kwargs["raw_request"])  # FastAPI passes the Request there
        handler_task = asyncio.ensure_future(handler(*args, **kwargs))
        watcher = asyncio.ensure_future(_wait_for_disconnect(raw_request))
        try:
            await asyncio.wait([handler_task, watcher], return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not handler_task.done():
                handler_task.cancel()
        if handler_task.cancelled() or not handler_task.done():
            await asyncio.gather(handler_task, return_exceptions=True)
            return None  # the client is gone: nobody reads a response
        return handler_task.result()

    return wrapper
