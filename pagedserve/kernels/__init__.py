"""Native and compiled kernels. Nothing here is built or imported until a backend asks for it."""
