"""Shared diffusion parts: denoise-loop node, samplers, guidance, seeded noise, packing, VAE paths."""
