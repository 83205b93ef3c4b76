"""How much memory the KV cache may take, per device kind."""
