"""Model building blocks. Linear and embedding layers are tensor-parallel; tp=1 is the degenerate case."""
