"""Params of a request as a text-encoder node sees them."""

from mstar.params import ImageParams


def text_params(prompt: str, guidance_scale: float, negative_prompt: str | None = None) -> ImageParams:
    return ImageParams(
        prompt=prompt, negative_prompt=negative_prompt or "", width=16, height=16,
        num_inference_steps=1, guidance_scale=guidance_scale, seed=0,
    )  # fmt: skip
