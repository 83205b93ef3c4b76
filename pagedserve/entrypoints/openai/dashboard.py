"""GET /dashboard: a live page for operators (one HTML file with its script and style inline: no CDN,
nothing fetched from elsewhere), and GET /dashboard/state, the JSON it polls every second: the KV block
pool as cells (free / held per request / cached prefix / shared), the queues, the totals from which the
page draws throughput and latency sparklines, and the admission queue."""

from importlib import resources
from typing import Any

import msgspec
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.metrics.dashboard import DashboardStatLogger


def _page() -> str:
    return (
        resources.files("pagedserve.entrypoints.openai").joinpath("static/dashboard.html").read_text("utf-8")
    )


def add_dashboard_routes(app: FastAPI, engine: AsyncLLM, dashboard: DashboardStatLogger) -> None:
    page = _page()
    model = engine.config.model

    @app.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
    async def get_dashboard() -> HTMLResponse:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    @app.get("/dashboard/state")
    async def get_dashboard_state() -> dict[str, Any]:
        """The engine's state now. `blocks` is null when the engine did not answer in time (a long
        step); `scheduler` and `totals` are the numbers /metrics shows."""
        snapshot = await engine.get_block_snapshot()
        return {
            **dashboard.state(),
            "model": model.served_model_name,
            "max_model_len": model.max_model_len,
            "blocks": None if snapshot is None else msgspec.structs.asdict(snapshot),
            "queue": {
                "requests": len(engine.admission.queued),
                "tokens": engine.admission.num_queued_tokens,
                "in_flight": engine.num_requests_in_flight,
            },
            "limits": msgspec.to_builtins(engine.limits),
        }
