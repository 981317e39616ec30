"""Z-Image-Turbo: Qwen3 text encoder, single-stream DiT, Flux-style VAE decoder."""
