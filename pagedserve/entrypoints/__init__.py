"""User-facing entry points: the offline LLM class, the CLI, the OpenAI-compatible server."""
