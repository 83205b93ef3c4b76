"""Serving statistics: what the frontend measures, the periodic log line and Prometheus metrics."""
