"""Qwen3's bench entry: what `mstar bench llm` compares the server with (transformers'
Qwen3ForCausalLM on the same seeded random weights). Light at import."""

from __future__ import annotations

from typing import Any

from mstar.models.bench_entry import TextBenchEntry


class Qwen3Bench(TextBenchEntry):
    family = "qwen3"

    def reference_model(self, model_config: Any, device: str, seed: int, dtype: Any) -> Any:
        """Our seeded random weights (bf16 values, as the server holds them) loaded by name into
        transformers' Qwen3ForCausalLM, in `dtype` on `device`."""
        import torch
        import transformers

        from mstar.models.qwen3.nodes import load_qwen3

        ours = load_qwen3(model_config, device, torch.bfloat16, seed=seed)
        with torch.device(device):  # not meta: the rotary buffers are computed at construction
            model = transformers.Qwen3ForCausalLM._from_config(
                transformers.Qwen3Config(**model_config.to_hf()), dtype=dtype
            )
        model.load_state_dict(dict(ours.state_dict()), strict=True)  # lm_head is listed even when tied
        del ours
        model.generation_config.eos_token_id = None
        return model.eval()
