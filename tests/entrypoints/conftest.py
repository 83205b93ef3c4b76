"""The SmolLM2 server that several test modules share (structured outputs and tools, the Responses and
Messages APIs): started once per session, since a start costs more than most of their tests."""

import os

import pytest
from server_utils import API_SERVER, RemoteServer

SMOL_TEMPLATE = os.path.join(os.path.dirname(__file__), "tool_template.jinja")
SMOL_MAX_SPEC_BYTES = 8192
SMOL_MAX_STORED_RESPONSES = 2


@pytest.fixture(scope="session")
def smol_server(default_model: str):
    """SmolLM2 with a tool-call template, "auto" tools (hermes), a bound on constraints, few stored
    responses; no API key (stored responses are then scoped by whatever key a client sends)."""
    args = [
        "--model",
        default_model,
        "--served-model-name",
        "smol",
        "--max-model-len",
        "1024",
        "--kv-cache-memory",
        "512MiB",
        "--chat-template",
        SMOL_TEMPLATE,
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--max-structured-output-bytes",
        str(SMOL_MAX_SPEC_BYTES),
        "--max-stored-responses",
        str(SMOL_MAX_STORED_RESPONSES),
        "--uvicorn-log-level",
        "warning",
    ]
    server = RemoteServer(API_SERVER, args)
    yield server
    server.stop()
