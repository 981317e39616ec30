"""The paged KV pool (engine resource): pages, prefix cache, layouts and attention over pages.

Torch-free at import: `pages` and `layout` are plain Python/numpy (the LLM scheduler uses them on
any machine); `pool`, `attention` and `build` import torch.
"""
