"""vLLM's sleep routes, behind the API key like every route: POST /sleep?level=1|2 frees the model's
weights and KV cache (the engine process stays, idle), POST /wake_up loads them again, GET /is_sleeping
says which. Requests that arrive while asleep get a 503 naming /wake_up, or wake it (--wake-on-request)."""

from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel

from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.entrypoints.openai.errors import ERROR_RESPONSES


class SleepStatus(BaseModel):
    is_sleeping: bool
    level: int  # 0: awake


def add_sleep_routes(app: FastAPI, engine: AsyncLLM, wake_on_request: bool) -> None:
    engine.sleep_control.wake_on_request = wake_on_request

    @app.post(
        "/sleep", response_class=Response, responses={200: {"description": "Asleep"}, **ERROR_RESPONSES}
    )
    async def sleep(level: int = 1) -> Response:
        """Level 1: free the weights and the KV cache, keep the checkpoint mapped (a fast wake); level 2:
        drop everything (the wake reads the files again)."""
        await engine.sleep(level)
        return Response(status_code=200)

    @app.post(
        "/wake_up", response_class=Response, responses={200: {"description": "Awake"}, **ERROR_RESPONSES}
    )
    async def wake_up() -> Response:
        await engine.wake_up()
        return Response(status_code=200)

    @app.get("/is_sleeping")
    async def is_sleeping() -> SleepStatus:
        level = engine.sleep_control.level
        return SleepStatus(is_sleeping=level > 0, level=level)
