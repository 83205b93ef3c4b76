"""The frontend's side of a block pool snapshot (the dashboard's): one question to the engine at a time,
answered between two of its steps, and a bounded wait for the answer."""

import asyncio

from pagedserve.engine.dp_client import DPClient
from pagedserve.engine.mp_client import MPClient
from pagedserve.protocol import BlockSnapshot

_SNAPSHOT_TIMEOUT_S = 5.0  # a block snapshot waits at most this long for the engine's step to end


class BlockSnapshotWait:
    """Use from the AsyncLLM's event loop."""

    def __init__(self, client: MPClient | DPClient) -> None:
        self.client = client
        self._snapshot: asyncio.Future[BlockSnapshot] | None = None

    async def get(self) -> BlockSnapshot | None:
        """The KV block pool's state, asked of the engine; None if the engine did not answer within a
        few seconds."""
        if self._snapshot is None or self._snapshot.done():
            self._snapshot = asyncio.get_running_loop().create_future()
            self.client.request_block_snapshot()
        try:
            return await asyncio.wait_for(asyncio.shield(self._snapshot), _SNAPSHOT_TIMEOUT_S)
        except TimeoutError:
            return None

    def answered(self, snapshot: BlockSnapshot | None) -> None:
        """The engine's outputs arrived, with a snapshot or none."""
        if snapshot is not None and self._snapshot is not None and not self._snapshot.done():
            self._snapshot.set_result(snapshot)
