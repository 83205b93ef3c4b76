"""Model families, one module each, behind `registry`."""
