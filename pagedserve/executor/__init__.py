"""Executors run the workers: in this process (uniproc), or one process per rank."""
