"""The Responses API's stored responses (`store`): in memory, least recently used dropped first, bounded in
count (--max-stored-responses) and bytes (--max-stored-response-bytes), each scoped to the API key that
made it, so `previous_response_id`, GET, DELETE and /cancel see only their own key's responses."""

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass, field

from pagedserve.errors import InvalidRequestError
from pagedserve.utils.user_json import JsonObject, as_string


@dataclass
class StoredResponse:
    """`response`: the Response object as last sent; `conversation`: the chat messages it continued
    (instructions left out, as the API does) and its own output, what a follow-up turn starts from."""

    response: JsonObject
    conversation: list[JsonObject] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)  # /cancel while in progress

    @property
    def id(self) -> str:
        return as_string(self.response["id"])

    def size(self) -> int:
        return len(json.dumps(self.response)) + len(json.dumps(self.conversation))


class ResponseStore:
    """Used from the event loop only (no lock). The bounds are checked by ServerArgs."""

    def __init__(self, max_responses: int, max_bytes: int) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str], tuple[StoredResponse, int]] = OrderedDict()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, scope: str, response_id: str, stored: StoredResponse) -> None:
        """Keep (or update) `stored`, then drop the least recently used until both bounds hold. A response
        larger than the byte bound alone is not kept."""
        self.delete(scope, response_id)
        size = stored.size()
        if size > self.max_bytes:
            return
        self._entries[scope, response_id] = (stored, size)
        self.num_bytes += size
        while len(self._entries) > self.max_responses or self.num_bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.num_bytes -= dropped

    def get(self, scope: str, response_id: str, param: str = "response_id") -> StoredResponse:
        """Raises InvalidRequestError (404) for an id this key never stored, or one dropped since."""
        entry = self._entries.get((scope, response_id))
        if entry is None:
            raise InvalidRequestError(
                f"{param}: no stored response {response_id[:100]!r} for this API key: it was never stored "
                "(store false), was deleted, belongs to another key, or was dropped as the oldest "
                "(--max-stored-responses, --max-stored-response-bytes).",
                param=param,
                status_code=404,
            )
        self._entries.move_to_end((scope, response_id))
        return entry[0]

    def delete(self, scope: str, response_id: str) -> bool:
        entry = self._entries.pop((scope, response_id), None)
        if entry is not None:
            self.num_bytes -= entry[1]
        return entry is not None
