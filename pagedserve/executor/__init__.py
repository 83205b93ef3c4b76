"""Executors run the workers: in this process (uniproc), one process per rank (multiproc), or one Ray
actor per rank (ray)."""
