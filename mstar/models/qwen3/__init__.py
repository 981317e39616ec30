"""Dense Qwen3 (0.6B to 8B): config, plain-PyTorch model, weights, spec."""
