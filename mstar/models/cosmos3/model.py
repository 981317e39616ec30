"""Cosmos3 as the runtime sees it: walks, request limits, node building. Light (no torch).

One walk per mode: `t2v` (Loop(dit) then vae_decoder; text-to-image is its one-frame case) and,
with an input image, `i2v` (vae_encoder, Loop(dit), vae_decoder). There is no text-encoder node:
the prompt's tokens go into the transformer's understanding pathway, which the dit node runs once
per request and label into the paged KV pool when the request enters its loop. The last walk
leaves "frames" uint8 [F, H, W, 3].
"""

from __future__ import annotations

from typing import Any

from mstar.errors import InvalidParam
from mstar.graph import BuildContext, GenerationParams, Loop, ModelSpec, Node, Walk
from mstar.models.cosmos3 import geometry
from mstar.models.cosmos3.config import NANO_TRANSFORMER, Cosmos3Config, Cosmos3PipelineFlags
from mstar.models.cosmos3.modes import IMAGE_FIELD, refuse_unbuilt_modes, select_mode
from mstar.models.validation import (
    check_prompts,
    guidance_in,
    int_in,
    multiple_in,
    range_limit,
    sampling_limits,
    seed_or_random,
)
from mstar.models.warmup import sized_warmup_requests
from mstar.params import VideoParams

MAX_GUIDANCE = 20.0
MAX_PROMPT_CHARS = 4096
MAX_STEPS = 200
MIN_FPS, MAX_FPS = 1, 60


class Cosmos3Params(VideoParams, kw_only=True):
    """A Cosmos3 request: num_frames 1 is text-to-image; an input image makes it image-to-video."""

    image_to_video: bool = False


class Cosmos3Spec(ModelSpec):
    name = "cosmos3-edge"
    task = "text-to-video"  # text-to-image at num_frames 1, image-to-video with input_reference
    output_kind = "video"
    extra_media_kinds = ("image",)  # /v1/images/generations: num_frames 1 at the recipe's image size
    params_type = Cosmos3Params
    node_names = ("vae_encoder", "dit", "vae_decoder")
    walks = {
        "t2v": Walk("t2v", (Loop("dit"), "vae_decoder"), outputs=("frames",)),
        "i2v": Walk("i2v", ("vae_encoder", Loop("dit"), "vae_decoder"), outputs=("frames",)),
    }
    max_side = 1280
    max_num_frames = 121

    def __init__(self, config: Cosmos3Config | None = None):
        self.config = config or Cosmos3Config()
        self.geometry = geometry.Cosmos3Geometry()

    @property
    def size_multiple(self) -> int:
        """Pixels per patch side: the VAE's spatial scale times the latent patch."""
        return self.config.vae.scale_factor_spatial * self.config.transformer.latent_patch_size

    @property
    def frame_step(self) -> int:
        return self.config.vae.scale_factor_temporal

    def limits(self) -> dict[str, Any]:
        r, m = self.config.recipe, self.size_multiple
        return {
            "width": {**range_limit(r.video_width, m, self.max_side), "multiple_of": m},
            "height": {**range_limit(r.video_height, m, self.max_side), "multiple_of": m},
            "num_frames": {**range_limit(r.num_frames, 1, self.max_num_frames), "form": f"{self.frame_step}k+1"},
            "fps": range_limit(int(r.fps), MIN_FPS, MAX_FPS),
            **sampling_limits(r.num_inference_steps, MAX_STEPS, r.guidance_scale, MAX_GUIDANCE, MAX_PROMPT_CHARS),
            IMAGE_FIELD: {"optional": True, "kind": "image"},
        }  # fmt: skip

    def validate(self, params: GenerationParams) -> Cosmos3Params:
        r = self.config.recipe
        check_prompts(params, MAX_PROMPT_CHARS)
        refuse_unbuilt_modes({"audio": params.audio})
        if params.seconds is not None:
            raise InvalidParam("seconds", "give num_frames (of the form 4k+1) for Cosmos3")
        num_frames = int_in("num_frames", params.num_frames, r.num_frames, 1, self.max_num_frames)
        if (num_frames - 1) % self.frame_step:
            raise InvalidParam("num_frames", f"must be of the form {self.frame_step}k+1, got {num_frames}")
        select_mode(num_frames, bool(params.has_input_reference))  # an image needs a video
        image = num_frames == 1
        width = self._side("width", params.width, r.image_width if image else r.video_width)
        height = self._side("height", params.height, r.image_height if image else r.video_height)
        return Cosmos3Params(
            prompt=params.prompt,
            negative_prompt=params.negative_prompt or "",
            width=width,
            height=height,
            num_frames=num_frames,
            fps=int_in("fps", params.fps, int(r.fps), MIN_FPS, MAX_FPS),
            num_inference_steps=int_in("num_inference_steps", params.num_inference_steps, r.num_inference_steps, 1, MAX_STEPS),
            guidance_scale=guidance_in(params.guidance_scale, r.guidance_scale, MAX_GUIDANCE),
            seed=seed_or_random(params.seed),
            image_to_video=bool(params.has_input_reference),
        )  # fmt: skip

    def _side(self, field: str, value: int | None, default: int) -> int:
        m = self.size_multiple
        return multiple_in(field, value, default, m, self.max_side, m)

    def step_tokens(self, params: Cosmos3Params) -> int:
        """Vision tokens of the request's latents times its guidance labels (the prefix is read,
        not computed, by a step)."""
        shape = geometry.latent_shape(self.config.vae, params.num_frames, params.height, params.width)
        tokens = geometry.num_vision_tokens(
            geometry.patch_grid(shape, self.config.transformer.latent_patch_size)
        )
        return tokens * len(geometry.guidance_labels(params.guidance_scale))

    def first_walk(self, params: Cosmos3Params) -> str:
        return "i2v" if params.image_to_video else "t2v"

    def next_walk(self, params: Cosmos3Params, finished: str) -> str | None:
        return None

    def warmup_requests(self, config: Any) -> list[Cosmos3Params]:
        return sized_warmup_requests(self, config.compile_sizes) if config.warmup else []

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        from mstar.models.cosmos3.nodes import build_nodes

        return build_nodes(self.config, ctx, self.name)


class Cosmos3NanoSpec(Cosmos3Spec):
    """Cosmos3-Nano: diffusers' default backbone and pipeline flags, Edge's request recipe."""

    name = "cosmos3-nano"

    def __init__(self, config: Cosmos3Config | None = None):
        super().__init__(
            config or Cosmos3Config(transformer=NANO_TRANSFORMER, pipeline=Cosmos3PipelineFlags())
        )


class TinyCosmos3Spec(Cosmos3Spec):
    """The CPU-sized Cosmos3 (tests, `--random-weights` smoke runs)."""

    name = "tiny-cosmos3"
    max_side = 256
    max_num_frames = 17

    def __init__(self, config: Cosmos3Config | None = None):
        from mstar.models.cosmos3.config import tiny_cosmos3_config

        super().__init__(config or tiny_cosmos3_config())
