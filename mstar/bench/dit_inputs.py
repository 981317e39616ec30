"""DiT step workloads, their seeded inputs, and diffusers' transformers run on them (the baseline).

An input item is one segment of a packed forward: {"latents": [C, F, h, w], "timestep": float,
"text": [S, text_dim]}. diffusers takes the same items as a batch (all the same size here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mstar.bench import flops


@dataclass(frozen=True)
class StepWorkload:
    name: str
    family: str  # "wan" | "zimage"
    width: int
    height: int
    num_frames: int  # 1 for images
    num_items: int  # segments in one forward: 2 for a guidance pair, 8 for 4 requests x 2 labels


STEP_WORKLOADS: dict[str, StepWorkload] = {
    w.name: w
    for w in (
        StepWorkload("wan-480p-b1", "wan", 832, 480, 33, 1),
        StepWorkload("wan-480p-cfg", "wan", 832, 480, 33, 2),
        StepWorkload("wan-480p-c4", "wan", 832, 480, 33, 8),
        StepWorkload("wan-720p-b1", "wan", 1280, 704, 121, 1),
        StepWorkload("zimage-1024-b1", "zimage", 1024, 1024, 1, 1),
        StepWorkload("zimage-1024-c4", "zimage", 1024, 1024, 1, 4),
        StepWorkload("zimage-1024-c8", "zimage", 1024, 1024, 1, 8),  # the c=8 serving target's pack
        StepWorkload("zimage-512-b1", "zimage", 512, 512, 1, 1),  # where host time may bound a step
        # CPU-sized twins for tests (used with the tiny configs)
        StepWorkload("tiny-wan-cfg", "wan", 64, 64, 5, 2),
        StepWorkload("tiny-zimage-c2", "zimage", 64, 64, 1, 2),
    )
}


def latent_shape(workload: StepWorkload, configs: dict[str, Any]) -> tuple[int, int, int, int]:
    transformer, stride = configs["transformer"], configs["vae_stride"]
    if workload.family == "wan":
        latent_frames = (workload.num_frames - 1) // 4 + 1
        return (
            transformer["in_channels"],
            latent_frames,
            workload.height // stride,
            workload.width // stride,
        )
    return (transformer["in_channels"], 1, workload.height // stride, workload.width // stride)


def segments(workload: StepWorkload, configs: dict[str, Any]) -> list[flops.Segment]:
    transformer, text_tokens = configs["transformer"], configs["text_tokens"]
    if workload.family == "wan":
        image = flops.wan_latent_tokens(workload.width, workload.height, workload.num_frames, transformer)
        return [flops.Segment(image, text_tokens)] * workload.num_items
    image = flops.pad_to_multiple(flops.zimage_image_tokens(workload.width, workload.height, transformer))
    return [flops.Segment(image, flops.pad_to_multiple(text_tokens))] * workload.num_items


def arch(family: str, transformer_config: dict[str, Any]) -> flops.DitArch:
    return flops.wan_arch(transformer_config) if family == "wan" else flops.zimage_arch(transformer_config)


def make_items(
    workload: StepWorkload, configs: dict[str, Any], device: str, dtype: Any, seed: int
) -> list[dict]:
    """Seeded inputs; the items of a guidance pair share latents and timestep, as in a real step."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    text_dim = configs["transformer"].get("text_dim") or configs["transformer"]["cap_feat_dim"]
    timestep = 500.0 if workload.family == "wan" else 0.5  # Z-Image takes (1000 - t) / 1000
    items = []
    for index in range(workload.num_items):
        if index % 2 == 0 or workload.family != "wan":
            latents = torch.randn(latent_shape(workload, configs), generator=generator)
        text = torch.randn(configs["text_tokens"], text_dim, generator=generator)
        items.append({"latents": latents, "timestep": timestep, "text": text})
    return [{k: v.to(device, dtype) if hasattr(v, "to") else v for k, v in item.items()} for item in items]


def build_diffusers_transformer(
    family: str, transformer_config: dict[str, Any], device: str, dtype: Any, seed: int
):
    """diffusers' transformer from the real config with seeded random init, built on `device`."""
    import torch

    if family == "wan":
        from diffusers import WanTransformer3DModel as model_class
    else:
        from diffusers import ZImageTransformer2DModel as model_class
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class(**transformer_config)
    from mstar.bench.ours import cast_parameters

    return cast_parameters(model, dtype, model_class._keep_in_fp32_modules).eval().requires_grad_(False)


def diffusers_forward(family: str, model: Any, items: list[dict]) -> list[Any]:
    """One forward of diffusers' transformer over the items as a batch; one output per item."""
    import torch

    device = items[0]["latents"].device
    timesteps = torch.tensor([item["timestep"] for item in items], device=device)
    if family == "wan":
        latents = torch.stack([item["latents"] for item in items])  # [B, C, F, h, w]
        # Wan2.2 TI2V (expand_timesteps) gives every latent token its own timestep, as the pipeline does.
        _, _, num_frames, height, width = latents.shape
        num_tokens = num_frames * (height // 2) * (width // 2)
        output = model(
            hidden_states=latents,
            timestep=timesteps[:, None].expand(-1, num_tokens),
            encoder_hidden_states=torch.stack([item["text"] for item in items]),
            return_dict=False,
        )[0]
        return list(output.unbind(0))
    return list(
        model(
            [item["latents"] for item in items], timesteps.to(items[0]["latents"].dtype),
            [item["text"] for item in items], return_dict=False,
        )[0]
    )  # fmt: skip


def output_psnr_db(ours: list[Any], reference: list[Any]) -> float:
    """PSNR (dB) of ours against the reference over all items: the reference's value range as the
    peak, in float32 (inf when equal)."""
    import math

    pairs = [(a.float().reshape(b.shape), b.float()) for a, b in zip(ours, reference, strict=True)]
    squared = sum(float((a - b).pow(2).sum()) for a, b in pairs)
    count = sum(b.numel() for _, b in pairs)
    peak = max(float(b.max() - b.min()) for _, b in pairs)
    if squared == 0:
        return math.inf
    mse = squared / max(count, 1)
    return 10 * math.log10(peak**2 / mse) if math.isfinite(mse) and peak > 0 else -math.inf


def relative_error(ours: list[Any], reference: list[Any]) -> float:
    """||ours - reference|| / ||reference|| over all items, in float32."""
    import torch

    # Shapes may differ by a unit frame axis (Z-Image: ours [C, H, W], diffusers [C, 1, H, W]).
    pairs = [(a.float().reshape(b.shape), b.float()) for a, b in zip(ours, reference, strict=True)]
    diff = sum(float((a - b).pow(2).sum()) for a, b in pairs)
    norm = sum(float(b.pow(2).sum()) for _, b in pairs)
    return (diff / max(norm, 1e-30)) ** 0.5 if torch.isfinite(torch.tensor(diff)) else float("inf")
