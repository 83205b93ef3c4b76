"""One worker per rank: the model, its KV cache tensors, and the step's batch tensors."""
