"""Per-request LoRA: adapters applied per segment of a packed step, never merged into base weights.

- weights.py: an adapter file (diffusers / PEFT / original / kohya key layouts) -> per-module A, B
  with alpha folded in, named by the model's diffusers module names.
- linear.py: the segmented LoRA linear and the per-step LoRA context its layers read.
- activation.py: an FFN's first Linear with its expand applied inside the activation after it.
- wrap.py: wraps a loaded model's Linears (the family names them) and packs adapters into slots.
- store.py: the device LRU of adapters, loaded on a thread off the step loop.

Importing this package imports no torch; its modules do.
"""
