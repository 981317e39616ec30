"""Hand-written kernels where the compiler's are slow; each has a PyTorch reference and a CPU impl."""
