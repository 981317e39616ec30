"""Wan2.2-TI2V-5B: text/image-to-video (DiT, VAE, model spec, nodes)."""
