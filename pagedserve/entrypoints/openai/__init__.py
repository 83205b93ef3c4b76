"""The OpenAI-compatible server: api_server (app and process), protocol (bodies), serving_* (endpoints)."""
