"""Multi-LoRA serving: adapters over one base model, mixed in a batch."""
