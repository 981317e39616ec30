"""Request bodies (pydantic). Types and coarse bounds here; the model's limits in spec.validate.

Unknown fields are refused (a typo such as `num_inference_step` must not be silently ignored); the
OpenAI fields we accept but do not use are listed so the official client's payloads pass.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from mstar.adapters import MAX_LORA_SCALE
from mstar.errors import InvalidParam
from mstar.graph import GenerationParams
from mstar.params import LoraChoice

SIZE_PATTERN = re.compile(r"^(\d{1,5})x(\d{1,5})$")
MAX_PROMPT_CHARS = 100_000  # a coarse guard; the model's token limit is checked by spec.validate
MAX_SEED = 2**63 - 1
MAX_N = 10
MAX_LORA_FIELDS = 16  # a coarse guard; the server's max_loras_per_request is checked on validation


def _reject_bool(value: Any) -> Any:
    # pydantic's lax mode reads true as 1; a boolean where a number belongs is a client bug.
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


Int = Annotated[int, BeforeValidator(_reject_bool)]
Float = Annotated[float, BeforeValidator(_reject_bool)]


def parse_size(size: str | None) -> tuple[int | None, int | None]:
    """'WxH' -> (width, height); None or 'auto' -> model defaults."""
    if size is None or size == "auto":
        return None, None
    match = SIZE_PATTERN.match(size)
    if match is None:
        raise InvalidParam("size", f"size must be 'WIDTHxHEIGHT' (e.g. '512x512'), got '{size}'")
    return int(match.group(1)), int(match.group(2))


def parse_seconds(seconds: str | None) -> float | None:
    if seconds is None:
        return None
    try:
        value = float(seconds)
    except ValueError:
        raise InvalidParam(
            "seconds", f"seconds must be a number as a string (e.g. '4'), got '{seconds}'"
        ) from None
    if not 0 < value <= 3600:
        raise InvalidParam("seconds", f"seconds must be in (0, 3600], got '{seconds}'")
    return value


class LoraField(BaseModel):
    """One entry of `lora`: an adapter of the server's lora_dir (GET /v1/loras) and its scale."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    scale: Float = Field(1.0, ge=-MAX_LORA_SCALE, le=MAX_LORA_SCALE, allow_inf_nan=False)


def _lora_from_form(value: Any) -> Any:
    # A multipart form carries `lora` as a JSON string.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ValueError("lora must be a JSON list of {name, scale}") from None
    return value


class _GenerationFields(BaseModel):
    """Fields shared by every generation route (flat extensions to the OpenAI shapes)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    model: str | None = None
    negative_prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    num_inference_steps: Int | None = Field(None, ge=1, le=1000)
    guidance_scale: Float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    seed: Int | None = Field(None, ge=0, le=MAX_SEED)
    lora: Annotated[list[LoraField], BeforeValidator(_lora_from_form)] | None = Field(
        None, max_length=MAX_LORA_FIELDS
    )
    user: str | None = None  # OpenAI field, accepted and unused

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("prompt must not be blank")
        return value

    def _shared_params(self, size: str | None, **route_fields: Any) -> GenerationParams:
        """GenerationParams from the fields every route shares, plus the route's own."""
        width, height = parse_size(size)
        return GenerationParams(
            prompt=self.prompt,
            negative_prompt=self.negative_prompt,
            width=width,
            height=height,
            num_inference_steps=self.num_inference_steps,
            guidance_scale=self.guidance_scale,
            lora=tuple(LoraChoice(item.name, item.scale) for item in self.lora or ()),
            **route_fields,
        )


class ImageGenerationRequest(_GenerationFields):
    """POST /v1/images/generations."""

    n: Int = Field(1, ge=1, le=MAX_N)
    size: str | None = None
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png", "jpeg", "webp"] | None = None
    output_compression: Int | None = Field(None, ge=0, le=100)
    # OpenAI fields accepted for compatibility; they do not change the output.
    quality: str | None = None
    style: str | None = None
    background: Literal["auto", "opaque"] | None = None
    moderation: str | None = None

    def generation_params(self, seed: int | None) -> GenerationParams:
        return self._shared_params(self.size, seed=seed)


class ImageEditRequest(_GenerationFields):
    """POST /v1/images/edits; `image` / `image[]` (and JSON `images`) are read by the route."""

    n: Int = Field(1, ge=1, le=MAX_N)
    size: str | None = None
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png", "jpeg", "webp"] | None = None
    output_compression: Int | None = Field(None, ge=0, le=100)
    stream: Literal[False] | None = None  # streamed partial images are not made
    partial_images: Literal[0] | None = None
    # OpenAI fields accepted for compatibility; they do not change the output.
    quality: str | None = None
    background: Literal["auto", "opaque"] | None = None
    input_fidelity: str | None = None

    def generation_params(
        self, seed: int | None, reference_sizes: tuple[tuple[int, int], ...]
    ) -> GenerationParams:
        return self._shared_params(self.size, seed=seed, reference_sizes=reference_sizes)


class VideoCreateRequest(_GenerationFields):
    """POST /v1/videos (JSON or multipart). `input_reference` is handled by the route (file or JSON)."""

    size: str | None = None
    seconds: str | None = None
    fps: Int | None = Field(None, ge=1, le=240)
    num_frames: Int | None = Field(None, ge=1, le=100_000)
    audio: bool | None = None  # a model with a soundtrack: false skips it (and its decode)
    input_reference: Any = None

    @field_validator("seconds", mode="before")
    @classmethod
    def _seconds_as_string(cls, value: Any) -> Any:
        # The OpenAI shape is a string; JSON clients often send a number. Booleans are not numbers.
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return value

    def generation_params(self, has_input_reference: bool) -> GenerationParams:
        return self._shared_params(
            self.size,
            seed=self.seed,
            num_frames=self.num_frames,
            fps=self.fps,
            seconds=parse_seconds(self.seconds),
            has_input_reference=has_input_reference,
            audio=self.audio,
        )


class NativeGenerateRequest(VideoCreateRequest):
    """POST /generate: every field, any model kind; `input_reference` is a base64 image or data URL."""

    n: Int = Field(1, ge=1, le=MAX_N)
    width: Int | None = Field(None, ge=1, le=100_000)
    height: Int | None = Field(None, ge=1, le=100_000)
    output_format: Literal["png", "jpeg", "webp"] | None = None

    def native_params(self, seed: int | None, has_input_reference: bool) -> GenerationParams:
        params = self.generation_params(has_input_reference)
        width = self.width if self.width is not None else params.width
        height = self.height if self.height is not None else params.height
        return dataclasses.replace(params, width=width, height=height, seed=seed)
