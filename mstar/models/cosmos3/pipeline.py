"""Cosmos3's pipeline, in Cosmos3OmniPipeline's order: tokenize the prompts, run the understanding
pathway once per label into the paged KV pool, encode the input image (image-to-video), prepare the
latents, predict every (request, label) of a step in one packed generation forward, guide, step,
finish, decode. The shared nodes drive it (mstar.diffusion.denoise, mstar.diffusion.vae_nodes).

The understanding prefix of a (request, label) is a pure function of its token ids, so its pages
are found by the pool's prefix cache: a repeated prompt (the negative prompt of every request of a
size above all) computes nothing. The pages are held from prepare_latents until the request leaves
its loop (finish), or until the node releases it on failure or cancellation.
"""

from __future__ import annotations

import torch

from mstar.diffusion.denoise import COND, DenoiseItem, DenoiseStart, DenoiseState
from mstar.diffusion.vae_nodes import INPUT_REFERENCE, LATENTS
from mstar.engine.kv.prefix import HeldPrefix, PagedPrefixKV, PrefixPages
from mstar.graph import RequestState
from mstar.models.cosmos3 import geometry
from mstar.models.cosmos3.conditioning import encode_image, initial_latents, preprocess_image
from mstar.models.cosmos3.config import Cosmos3Config
from mstar.models.cosmos3.geometry import IMAGE_CONDITION_FRAMES, UNCOND
from mstar.models.cosmos3.model import Cosmos3Params
from mstar.models.cosmos3.sampling import guide, make_sampler
from mstar.models.cosmos3.text import PromptRequest, prompt_token_ids
from mstar.models.cosmos3.transformer import VisionInput
from mstar.models.wan22.vae import denormalize_latents

IMAGE_LATENTS = "image_latents"  # request tensor: the input image's normalised latents [C, 1, h, w]
HELD = "held_prefixes"  # condition key: the request's HeldPrefix pages, released once
CLEAN_FRAMES, FPS = "clean_frames", "fps"
NAMESPACE = "cosmos3.understanding"  # the K/V depend on the token ids only, not on the label


class Cosmos3Pipeline:
    """Components, each None where this worker does not hold it: `dit` (Cosmos3Transformer) with
    `tokenizer`, `ragged` (its understanding attention), `dense` (PrefixAttention) and `prefixes`
    (PrefixPages over the KV pool); `vae_encoder`; `decoder` (VaeDecodeRunner)."""

    def __init__(
        self, config: Cosmos3Config, device: str | torch.device, dtype: torch.dtype, *,
        dit=None, tokenizer=None, ragged=None, dense=None, prefixes: PrefixPages | None = None,
        max_prompt_tokens: int = 2048, vae_encoder=None, decoder=None,
    ):  # fmt: skip
        self.config = config
        self.device, self.dtype = torch.device(device), dtype
        self.dit, self.tokenizer, self.ragged, self.dense = dit, tokenizer, ragged, dense
        self.prefixes = prefixes
        self.max_prompt_tokens = max_prompt_tokens
        self.vae_encoder, self.decoder = vae_encoder, decoder

    # ---- 1. prompts: token ids per label ----------------------------------------------------

    def prompt_ids(self, params: Cosmos3Params) -> dict[str, list[int]]:
        request = PromptRequest(
            params.prompt, params.num_frames, params.height, params.width, float(params.fps),
            params.negative_prompt or None,
        )  # fmt: skip
        ids = prompt_token_ids(self.tokenizer, request, self.config.pipeline.default_use_system_prompt)
        labels = geometry.guidance_labels(params.guidance_scale)
        chosen = {label: ids.uncond if label == UNCOND else ids.cond for label in labels}
        for label, tokens in chosen.items():
            if len(tokens) > self.max_prompt_tokens:
                field = "negative_prompt" if label == UNCOND else "prompt"
                raise ValueError(f"{field}: {len(tokens)} tokens, at most {self.max_prompt_tokens}")
        return chosen

    # ---- 2. the understanding prefix: once per (request, label), into the pool -------------

    @torch.inference_mode()
    def understand(self, params: Cosmos3Params) -> dict[str, HeldPrefix]:
        """Each label's prefix pages, from the prefix cache or one understanding forward. On any
        error nothing stays held."""
        held: dict[str, HeldPrefix] = {}
        try:
            for label, tokens in self.prompt_ids(params).items():
                held[label] = self.prefixes.acquire(
                    tokens, lambda t=tokens: self.dit.understand(t, self.ragged)
                )
        except BaseException:
            for prefix in held.values():
                self.prefixes.release(prefix)
            raise
        return held

    # ---- 3. the input image (vae_encoder node, image-to-video) ------------------------------

    @torch.inference_mode()
    def encode_image(self, request: RequestState) -> None:
        if INPUT_REFERENCE not in request.tensors:
            raise ValueError(
                f"request {request.request_id}: image-to-video needs an '{INPUT_REFERENCE}' image"
            )
        image = request.tensors.pop(INPUT_REFERENCE)
        pixels = image.cpu().numpy() if isinstance(image, torch.Tensor) else image
        params = request.params
        request.tensors[IMAGE_LATENTS] = encode_image(
            self.vae_encoder, preprocess_image(pixels, params.height, params.width)
        )

    # ---- 4. the denoise loop (dit node) -----------------------------------------------------

    def prepare_latents(self, request: RequestState) -> DenoiseStart:
        params: Cosmos3Params = request.params
        shape = geometry.latent_shape(self.config.vae, params.num_frames, params.height, params.width)
        image_latents = request.tensors.pop(IMAGE_LATENTS, None)
        latents = initial_latents(shape, params.seed, image_latents).to(self.device)
        sampler = make_sampler(self.config, params.num_inference_steps, self.config.recipe.flow_shift)
        grid = geometry.patch_grid(shape, self.config.transformer.latent_patch_size)
        held = self.understand(params)  # last: nothing after it can fail and leak the pages
        return DenoiseStart(
            latents=latents,
            sampler=sampler,
            num_tokens=geometry.num_vision_tokens(grid),
            texts=held,
            guidance_scale=float(params.guidance_scale),
            condition={
                HELD: list(held.values()),
                CLEAN_FRAMES: IMAGE_CONDITION_FRAMES if image_latents is not None else (),
                FPS: float(params.fps),
            },
        )

    @torch.inference_mode()
    def predict(self, items: list[DenoiseItem]) -> list[torch.Tensor]:
        """Every item's velocity through one packed generation forward; item i's vision queries
        attend to its own prefix, gathered from the pool (its page rows copied to the device once
        for the whole forward)."""
        inputs = [
            VisionInput(item.latents, item.timestep, item.condition[FPS], item.condition[CLEAN_FRAMES])
            for item in items
        ]
        prefix = PagedPrefixKV(self.prefixes.pool, [item.text for item in items])
        return self.dit.generate(inputs, prefix, self.dense)

    def guide(self, outputs: dict[str, torch.Tensor], guidance_scale: float) -> torch.Tensor:
        """The pipeline's rule in float32: uncond + scale * (cond - uncond), cond alone at scale 1."""
        return guide(outputs[COND], outputs.get(UNCOND), guidance_scale)

    def step(self, state: DenoiseState, guided: torch.Tensor) -> torch.Tensor:
        return state.sampler.step(guided, state.latents)

    def finish(self, request: RequestState, state: DenoiseState) -> None:
        """The final latents leave for the decoder; the prefix pages go back to the pool now (the
        decode runs without them)."""
        self.release(state)
        request.tensors[LATENTS] = state.latents

    def release(self, state: DenoiseState) -> None:
        """Give back the request's prefix pages (finish, failure, cancel); a second call is a no-op."""
        for prefix in state.condition.pop(HELD, ()):
            self.prefixes.release(prefix)

    def event_counts(self) -> dict[str, int]:
        return {
            "prefix_cache_hits": self.prefixes.num_hits,
            "understanding_forwards": self.prefixes.num_computed,
        }

    def gauges(self) -> dict[str, float]:
        return {"kv_pool_usage": self.prefixes.pool.pages.stats().usage}

    def warmup_item(self, size) -> DenoiseItem:
        """A zero item of a compile size (None: the recipe's video) over a one-page prompt, for the
        boot warmup (its pages stay cached; a prompt of that text would reuse them)."""
        width, height, num_frames = self._size(size)
        shape = geometry.latent_shape(self.config.vae, num_frames, height, width)
        tokens = [0] * self.prefixes.pool.page_tokens
        held = self.prefixes.acquire(tokens, lambda: self.dit.understand(tokens, self.ragged))
        self.prefixes.release(held)  # cached: the warmup forward reads the pages, nothing holds them
        condition = {CLEAN_FRAMES: (), FPS: float(self.config.recipe.fps)}
        latents = torch.zeros(shape, device=self.device)
        return DenoiseItem("warmup", COND, latents, 999.0, 1.0, 0, held, condition)

    def _size(self, size) -> tuple[int, int, int]:
        r = self.config.recipe
        if size is None:
            return r.video_width, r.video_height, r.num_frames
        return size.width, size.height, size.num_frames or r.num_frames

    # ---- 5. decode (vae_decoder node) -------------------------------------------------------

    def _vae_latents(self, latents: torch.Tensor) -> torch.Tensor:
        latents = latents.to(self.decoder.device, torch.float32)[None]
        return denormalize_latents(latents, self.decoder.decoder.config).to(self.decoder.dtype)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Final latents [C, F', h, w] -> uint8 frames [F, H, W, 3] (one frame: an image)."""
        return self.decoder.decode_uint8(self._vae_latents(latents))

    def decode_pieces(self, latents: torch.Tensor):
        yield from self.decoder.iter_host_uint8(self._vae_latents(latents))

    def warmup_decode(self, size, index: int) -> None:
        """Compile one size's clip decode and check it against the plain decode, inline, on seeded
        random latents (zeros decode to near-flat frames and would hide a miscompile)."""
        from mstar.diffusion.noise import seeded_noise

        width, height, num_frames = self._size(size)
        shape = geometry.latent_shape(self.config.vae, num_frames, height, width)
        latents = seeded_noise((1, *shape), seed=index).to(self.decoder.device, self.decoder.dtype)
        self.decoder.warm_decode(latents)
