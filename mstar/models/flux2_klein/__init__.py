"""FLUX.2 [klein]: Qwen3 text encoder, double- then single-stream DiT, AutoencoderKLFlux2."""
