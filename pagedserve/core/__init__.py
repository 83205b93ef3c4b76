"""Scheduling and KV-cache bookkeeping. Pure Python: never imports torch."""
