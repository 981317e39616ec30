"""Which Cosmos3OmniPipeline mode a request is, and the modes this family does not build yet.

diffusers' pipeline picks its mode from its arguments: text-to-image when num_frames == 1,
image-to-video when `image` is given, video-to-video when `video` is given, sound generation with
`enable_sound=True` (a sound-capable checkpoint and its sound_tokenizer), action-conditioned
generation (forward / inverse dynamics, policy) with `action`, else text-to-video. We build
text-to-image, text-to-video and image-to-video; a request naming any argument of another mode is
refused with InvalidParam (HTTP 400) naming that field. No torch here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from mstar.errors import InvalidParam

IMAGE_FIELD = "input_reference"  # the API's field for the conditioning image


class Mode(enum.StrEnum):
    TEXT_TO_IMAGE = "text-to-image"
    TEXT_TO_VIDEO = "text-to-video"
    IMAGE_TO_VIDEO = "image-to-video"


# Cosmos3OmniPipeline.__call__ arguments that select a mode we do not build, and that mode; and
# `audio`, our API's soundtrack switch (true asks for the sound Cosmos3 would generate). The API
# refuses the pipeline's own names as unknown fields; the spec refuses what reaches it.
UNBUILT_MODE_FIELDS: dict[str, str] = {
    "audio": "sound generation",
    "enable_sound": "sound generation",
    "sound_latents": "sound generation",
    "action": "action-conditioned generation (forward dynamics, inverse dynamics, policy)",
    "action_latents": "action-conditioned generation (forward dynamics, inverse dynamics, policy)",
    "video": "video-to-video",
    "condition_frame_indexes_vision": "video-to-video",
    "condition_video_keep": "video-to-video",
}


def refuse_unbuilt_modes(fields: Mapping[str, Any]) -> None:
    """InvalidParam naming the first field that asks for sound, action or video-to-video."""
    for name, mode in UNBUILT_MODE_FIELDS.items():
        value = fields.get(name)
        if value is not None and value is not False:
            raise InvalidParam(name, f"{mode} is not supported by this server yet")


def select_mode(num_frames: int, has_image: bool) -> Mode:
    """The mode of a request the pipeline would run (after refuse_unbuilt_modes).

    diffusers ignores an image given with num_frames == 1; we refuse it instead of dropping input."""
    if num_frames == 1:
        if has_image:
            raise InvalidParam(IMAGE_FIELD, "an input image needs a video (num_frames > 1)")
        return Mode.TEXT_TO_IMAGE
    return Mode.IMAGE_TO_VIDEO if has_image else Mode.TEXT_TO_VIDEO
