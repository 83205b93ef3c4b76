"""The engine: EngineCore (scheduler + KV manager + executor) and the frontend around it."""
