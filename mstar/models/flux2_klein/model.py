"""FLUX.2 [klein] as the runtime sees it: walks, request limits, node building.

Light on purpose (no torch at import): the API process validates requests with this spec.
Walks: `encode_text` (Qwen3: the prompt, and "" under classifier-free guidance), then `t2i`
(Loop(dit) of flow-matching Euler steps, then vae_decoder -> "frames" uint8 [1, H, W, 3]) or, for
an edit, `edit` (vae_encoder: the reference images to latents, then the same loop and decode).

Defaults and limits are Flux2KleinPipeline's: 50 steps, guidance 4.0 (ignored by the distilled
checkpoints: one label; the base ones run it as a second, unconditional label), 1024 x 1024 or,
for an edit, the first reference's encoded size; up to 4 reference images.
"""

from __future__ import annotations

from typing import Any

from mstar.errors import InvalidParam
from mstar.graph import BuildContext, GenerationParams, Loop, ModelSpec, Node, Walk, reference_image_input
from mstar.models.flux2_klein.config import KLEIN_4B, KLEIN_9B, KLEIN_BASE_4B, KLEIN_BASE_9B, Flux2KleinConfig
from mstar.models.flux2_klein.edits import check_reference_images
from mstar.models.flux2_klein.geometry import (
    DEFAULT_GUIDANCE_SCALE,
    DEFAULT_NUM_STEPS,
    MAX_REFERENCE_IMAGES,
    Flux2KleinGeometry,
    reference_pixel_size,
    warmup_reference_size,
)
from mstar.models.validation import (
    check_prompts,
    guidance_in,
    multiple_in,
    range_limit,
    sampling_limits,
    seed_or_random,
    single_frame_limit,
    steps_in,
)
from mstar.models.warmup import WARMUP_STEPS, sized_warmup_requests
from mstar.params import ImageParams

DEFAULT_SIZE = 1024
MIN_SIDE = 64
MAX_SIDE = 4096
MAX_PIXELS = 2048 * 2048  # 4 MP, the largest output BFL documents for klein
MAX_STEPS = 100
MAX_GUIDANCE = 20.0
MAX_PROMPT_CHARS = 8192  # the prompt is truncated to 512 tokens, as the pipeline truncates it
WARMUP_NUM_REFERENCES = 2  # the boot warmup's edits: two references (the edit the benchmark times)


class Flux2KleinParams(ImageParams, kw_only=True):
    """A klein request; an edit's reference images go as inputs `reference_0`, `reference_1`, ...
    (uint8 [H, W, 3]), their (width, height) here."""

    reference_sizes: tuple[tuple[int, int], ...] = ()


class Flux2KleinSpec(ModelSpec):
    name = "flux2-klein-4b"
    task = "text-to-image"  # and image editing with up to four reference images
    output_kind = "image"
    params_type = Flux2KleinParams
    node_names = ("text_encoder", "vae_encoder", "dit", "vae_decoder")
    max_reference_images = MAX_REFERENCE_IMAGES
    walks = {
        "encode_text": Walk("encode_text", ("text_encoder",)),
        "t2i": Walk("t2i", (Loop("dit"), "vae_decoder"), outputs=("frames",)),
        "edit": Walk("edit", ("vae_encoder", Loop("dit"), "vae_decoder"), outputs=("frames",)),
    }
    preset: Flux2KleinConfig = KLEIN_4B
    min_side = MIN_SIDE  # class attributes: a spec for the tests' tiny VAE lowers them

    def __init__(self, config: Flux2KleinConfig | None = None):
        self.config = config or self.preset
        self.geometry = Flux2KleinGeometry.of(self.config)

    def limits(self) -> dict[str, Any]:
        multiple = self.geometry.size_multiple
        side = {**range_limit(DEFAULT_SIZE, self.min_side, MAX_SIDE), "multiple_of": multiple}
        guidance = DEFAULT_GUIDANCE_SCALE
        return {
            "width": side,
            "height": dict(side),
            "pixels": {"min": self.min_side**2, "max": MAX_PIXELS},
            **sampling_limits(DEFAULT_NUM_STEPS, MAX_STEPS, guidance, MAX_GUIDANCE, MAX_PROMPT_CHARS),
            "num_frames": single_frame_limit(),
            "image": {"optional": True, "kind": "image", "max_count": self.max_reference_images},
            "guidance": "ignored (step-distilled)" if self.config.is_distilled else "classifier-free",
        }

    def validate(self, params: GenerationParams) -> Flux2KleinParams:
        check_prompts(params, MAX_PROMPT_CHARS)
        if params.has_input_reference:
            raise InvalidParam("input_reference", f"{self.name} takes reference images as an edit's image[]")
        if params.num_frames not in (None, 1):
            raise InvalidParam(
                "num_frames", f"{self.name} makes single images; got {params.num_frames} frames"
            )
        references = tuple((int(w), int(h)) for w, h in params.reference_sizes)
        if references:
            check_reference_images(list(references), max_images=self.max_reference_images)
        default_width, default_height = self._default_size(references)
        width = self._side("width", params.width, default_width)
        height = self._side("height", params.height, default_height)
        if width * height > MAX_PIXELS:
            raise InvalidParam(
                "width", f"width*height must be at most {MAX_PIXELS} pixels, got {width}x{height}"
            )
        return Flux2KleinParams(
            prompt=params.prompt,
            negative_prompt=params.negative_prompt or "",
            width=width,
            height=height,
            num_inference_steps=steps_in(params.num_inference_steps, DEFAULT_NUM_STEPS, MAX_STEPS),
            guidance_scale=guidance_in(params.guidance_scale, DEFAULT_GUIDANCE_SCALE, MAX_GUIDANCE),
            seed=seed_or_random(params.seed),
            reference_sizes=references,
        )

    def _default_size(self, references: tuple[tuple[int, int], ...]) -> tuple[int, int]:
        """(width, height) when the request names none: the first reference's encoded size (the
        pipeline's), within this spec's side limits; else 1024 x 1024."""
        if not references:
            return DEFAULT_SIZE, DEFAULT_SIZE
        width, height = reference_pixel_size(*references[0], vae_scale=self.geometry.vae_scale)
        return min(max(width, self.min_side), MAX_SIDE), min(max(height, self.min_side), MAX_SIDE)

    def _side(self, field: str, value: int | None, default: int) -> int:
        return multiple_in(field, value, default, self.min_side, MAX_SIDE, self.geometry.size_multiple)

    def step_tokens(self, params: Flux2KleinParams) -> int:
        """Prompt (512), output and reference tokens, times the guidance labels."""
        return self.geometry.step_tokens(
            params.width, params.height, params.guidance_scale, params.reference_sizes
        )

    def first_walk(self, params: Flux2KleinParams) -> str:
        return "encode_text"

    def next_walk(self, params: Flux2KleinParams, finished: str) -> str | None:
        if finished == "encode_text":
            return "edit" if params.reference_sizes else "t2i"
        return None

    def warmup_requests(self, config: Any) -> list[Flux2KleinParams]:
        """Per configured size a text-to-image request, then an edit at that size with
        WARMUP_NUM_REFERENCES reference images (warmup_inputs) through the edit walk."""
        if not config.warmup:
            return []
        t2i = sized_warmup_requests(self, config.compile_sizes)
        edits = [self._warmup_edit(params) for params in t2i]
        return t2i + [params for params in edits if params is not None]

    def _warmup_edit(self, t2i: Flux2KleinParams) -> Flux2KleinParams | None:
        reference = warmup_reference_size(t2i.width, t2i.height)
        if reference is None:
            return None
        params = GenerationParams(
            prompt=t2i.prompt, width=t2i.width, height=t2i.height, num_inference_steps=WARMUP_STEPS,
            seed=0, reference_sizes=(reference,) * min(WARMUP_NUM_REFERENCES, self.max_reference_images),
        )  # fmt: skip
        return self.validate(params)

    def warmup_inputs(self, params: Flux2KleinParams) -> dict[str, Any]:
        """A warmup edit's reference images: seeded noise, uint8 [H, W, 3] as the API decodes uploads."""
        import numpy as np

        rng = np.random.default_rng(0)
        return {
            reference_image_input(index): rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            for index, (width, height) in enumerate(params.reference_sizes)
        }

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        from mstar.models.flux2_klein.nodes import build_nodes

        return build_nodes(self.config, ctx, self.name)


class Flux2Klein9BSpec(Flux2KleinSpec):
    name = "flux2-klein-9b"
    preset = KLEIN_9B


class Flux2KleinBase4BSpec(Flux2KleinSpec):
    """The undistilled checkpoint: classifier-free guidance as a second label."""

    name = "flux2-klein-base-4b"
    preset = KLEIN_BASE_4B


class Flux2KleinBase9BSpec(Flux2KleinSpec):
    name = "flux2-klein-base-9b"
    preset = KLEIN_BASE_9B
