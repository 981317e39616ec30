"""Params of a request as a text-encoder node sees them."""

from mstar.params import ImageParams


def text_params(prompt: str, guidance_scale: float, negative_prompt: str | None = None) -> ImageParams:
    return ImageParams(
        prompt=prompt, negative_prompt=negative_prompt or "", width=16, height=16,
        num_inference_steps=1, guidance_scale=guidance_scale, seed=0,
    )  # fmt: skip


def wan_text_node(encoder, **node_options):
    """The shared text_encoder node over Wan's pipeline holding `encoder` (Wan's guidance rule)."""
    import torch

    from mstar.models.text_encoding import PromptEmbedsNode
    from mstar.models.wan22.config import tiny_wan22_config
    from mstar.models.wan22.pipeline import WanPipeline

    return PromptEmbedsNode(
        WanPipeline(tiny_wan22_config(), "cpu", torch.float32, text_encoder=encoder), **node_options
    )


def zimage_text_node(encoder, **node_options):
    """The shared text_encoder node over Z-Image's pipeline holding `encoder` (its guidance rule)."""
    from mstar.models.text_encoding import PromptEmbedsNode
    from mstar.models.zimage.config import TINY
    from mstar.models.zimage.pipeline import ZImagePipeline

    return PromptEmbedsNode(ZImagePipeline(TINY, "cpu", text_encoder=encoder), **node_options)
