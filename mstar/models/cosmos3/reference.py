"""diffusers' Cosmos3 driven as the parity and benchmark baseline (never on the serving path): one
full Cosmos3OmniTransformer forward for one item, its joint sequence built as Cosmos3OmniPipeline
builds it, the scheduler settings of a config as diffusers' keyword arguments, and the pipeline
loaded from a saved folder.

    velocity = diffusers_velocity(theirs, input_ids, latents, timestep, clean_frames=(0,))
    pipe = load_pipeline(folder, "cpu", torch.float32)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from mstar.models.cosmos3.config import Cosmos3Config


def scheduler_dict(config: Cosmos3Config) -> dict[str, Any]:
    """UniPCMultistepScheduler keyword arguments of the config's scheduler (flow matching)."""
    values = dataclasses.asdict(config.scheduler)
    values["disable_corrector"] = list(values["disable_corrector"])
    if not values["use_karras_sigmas"]:
        values.pop("sigma_min"), values.pop("sigma_max")
    return {**values, "prediction_type": "flow_prediction", "use_flow_sigmas": True,
            "predict_x0": True, "final_sigmas_type": "zero"}  # fmt: skip


def diffusers_velocity(
    transformer,
    input_ids: list[int],
    latents: torch.Tensor,
    timestep: float,
    fps: float = 24.0,
    clean_frames: tuple[int, ...] = (),
    temporal_compression: int = 4,
) -> torch.Tensor:
    """Cosmos3OmniTransformer's prediction [C, F, H, W] for one item, its joint sequence built as
    Cosmos3OmniPipeline builds it (text segment, then the vision segment after the mRoPE margin)."""
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
        get_3d_mrope_ids_text_tokens,
        get_3d_mrope_ids_vae_tokens,
    )

    config = transformer.config
    device = next(transformer.parameters()).device
    num_text = len(input_ids)
    text_ids, next_offset = get_3d_mrope_ids_text_tokens(num_text, 0, config.enable_fps_modulation)
    channels, frames, height, width = latents.shape
    p = config.latent_patch_size
    grid_h, grid_w = -(-height // p), -(-width // p)
    per_frame = grid_h * grid_w
    vision_ids, _ = get_3d_mrope_ids_vae_tokens(
        frames,
        grid_h,
        grid_w,
        next_offset + config.unified_3d_mrope_temporal_modality_margin,
        reset_spatial_indices=config.unified_3d_mrope_reset_spatial_ids,
        fps=fps if config.enable_fps_modulation else None,
        base_fps=float(config.base_fps),
        temporal_compression_factor=temporal_compression,
    )
    noisy = [frame for frame in range(frames) if frame not in clean_frames]
    loss_indexes = [num_text + f * per_frame + i for f in noisy for i in range(per_frame)]
    num_vision = frames * per_frame
    with torch.no_grad():
        predictions = transformer(
            input_ids=torch.tensor(input_ids, device=device),
            text_indexes=torch.arange(num_text, device=device),
            position_ids=torch.cat([text_ids, vision_ids], dim=1).to(device),
            und_len=num_text,
            sequence_length=num_text + num_vision,
            vision_tokens=[latents[None].to(device, transformer.dtype)],
            vision_token_shapes=[(frames, grid_h, grid_w)],
            vision_sequence_indexes=torch.arange(num_text, num_text + num_vision, device=device),
            vision_mse_loss_indexes=torch.tensor(loss_indexes, device=device),
            vision_timesteps=torch.full((len(noisy) * per_frame,), int(timestep), device=device),
            vision_noisy_frame_indexes=[torch.tensor(noisy, dtype=torch.long, device=device)],
            return_dict=False,
        )[0]
    return predictions[0][0]


@contextlib.contextmanager
def built_in(device: str | torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Modules made inside are made on `device` with parameters in `dtype` (diffusers' Cosmos3
    builds its rotary buffer in float32 explicitly): a Nano-sized model (14.6B parameters) is
    never made in float32 on the host first."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def load_pipeline(folder, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Cosmos3OmniPipeline from a saved folder: the transformer in `dtype` (its fp32 modules kept),
    the VAE in float32 as the checkpoint's.

    The transformer is read from the folder's own config and safetensors and handed in:
    Cosmos3OmniTransformer.from_pretrained needs `accelerate` (its fp32 time embedder forces
    low_cpu_mem_usage), which is not a dependency; every other part comes from
    Cosmos3OmniPipeline.from_pretrained. It is made on the device in `dtype` (its fp32 modules
    cast before the copy, so they keep the checkpoint's precision) and filled shard by shard."""
    from pathlib import Path

    from diffusers import Cosmos3OmniPipeline, Cosmos3OmniTransformer
    from safetensors.torch import load_file

    from mstar.bench.baseline import cast_parameters

    transformer_dir = Path(folder) / "transformer"
    with built_in(device, dtype):
        transformer = Cosmos3OmniTransformer.from_config(
            Cosmos3OmniTransformer.load_config(str(transformer_dir))
        )
    transformer = cast_parameters(transformer, dtype, getattr(transformer, "_keep_in_fp32_modules", None))
    expected, loaded = set(transformer.state_dict()), set()
    for path in sorted(transformer_dir.glob("*.safetensors")):
        shard = load_file(str(path), device=str(torch.device(device)))
        _, unexpected = transformer.load_state_dict(shard, strict=False)
        if unexpected:
            raise ValueError(f"{path}: tensors the transformer lacks, e.g. {unexpected[0]}")
        loaded.update(shard)
        del shard
    if expected - loaded:
        raise ValueError(f"{transformer_dir}: no tensor for {sorted(expected - loaded)[0]}")
    pipe = Cosmos3OmniPipeline.from_pretrained(str(folder), transformer=transformer.eval()).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe
