"""LTX-2: Gemma 3 text encoder with text connectors, a two-stream (video and audio) DiT with
cross-modal attention, a video VAE, an audio VAE and a vocoder."""
