"""Lone UTF-16 surrogates: JSON lets a string hold one (the escape "\\ud800" without its pair), Python keeps
it, and nothing after can use it (the tokenizer, the engine's msgpack, the JSON of the answer all fail). They
are the client's mistake: `reject_lone_surrogates` refuses a request body holding one anywhere (400,
naming where), before any route reads it; `has_lone_surrogate` checks text the model wrote."""

import asyncio
import json
import re

from fastapi import Request

from pagedserve.errors import InvalidRequestError

# NOTE: json.loads joins a valid pair into one character, so every surrogate left in a string is lone.
_SURROGATE = re.compile("[\ud800-\udfff]")
_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")

# Where a JSON value is in the body: (the path to its container, its key or index); None is the body.
_Path = tuple["_Path", str | int] | None


def has_lone_surrogate(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def lone_surrogate_path(value: object) -> str | None:
    """Where the first string of `value` (parsed JSON) holding a lone surrogate is, a value or a key, as
    `messages[0].content`; None when there is none. Iterative: any nesting json.loads returns is walked."""
    try:  # NOTE: the common case at C speed (10x the walk's): UTF-8 has no form for a lone surrogate
        json.dumps(value, ensure_ascii=False).encode()
        return None
    except (UnicodeEncodeError, RecursionError):
        pass
    stack: list[tuple[_Path, object]] = [(None, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if has_lone_surrogate(item):
                return _format(path)
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                stack += [((path, key), child), ((path, key), key)]
        elif isinstance(item, list):
            stack += [((path, index), item[index]) for index in range(len(item) - 1, -1, -1)]
    return None


def _format(path: _Path) -> str:
    parts: list[str] = []
    while path is not None:
        path, key = path
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif _NAME.fullmatch(key):
            parts.append(f".{key}")
        else:  # NOTE: json.dumps escapes the surrogate: the message itself stays valid text
            parts.append(f"[{json.dumps(key)}]")
    return "".join(reversed(parts)).removeprefix(".") or "body"


def check_no_lone_surrogates(body: object) -> None:
    """Raises InvalidRequestError (400) naming the field of `body` (parsed JSON) that holds one."""
    path = lone_surrogate_path(body)
    if path is not None:
        raise InvalidRequestError(
            f"{path} holds a lone UTF-16 surrogate (\\ud800 to \\udfff without its pair), which is not "
            f"Unicode text: remove it from {path}, or send the whole pair.",
            param=path,
        )


async def reject_lone_surrogates(request: Request) -> None:
    """A dependency of every route: the body FastAPI parsed (cached by the request), checked in a thread
    (a large body never holds up the event loop). A body that is not JSON is left to FastAPI's 400."""
    if not await request.body():
        return
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        return
    await asyncio.to_thread(check_no_lone_surrogates, body)
