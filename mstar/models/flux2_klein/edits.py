"""Checks of an edit request's reference images (the `/v1/images/edits` `image` / `image[]`
field) against the klein limits, before any work: torch-free, for the API process. Decoding
(format, the upload pixel cap) is the API's mstar.api.media.decode_image; this takes the decoded
sizes. A refusal is an InvalidParam naming the field and, with several images, the index."""

from __future__ import annotations

from mstar.errors import InvalidParam
from mstar.models.flux2_klein.geometry import MAX_REFERENCE_IMAGES, reference_size_error


def check_reference_images(
    sizes: list[tuple[int, int]], field: str = "image", max_images: int = MAX_REFERENCE_IMAGES
) -> None:
    """sizes: (width, height) of each decoded image, in upload order; at least one, at most max_images."""
    if not sizes:
        raise InvalidParam(field, "an edit needs at least one image")
    if len(sizes) > max_images:
        raise InvalidParam(field, f"at most {max_images} images, got {len(sizes)}")
    for index, (width, height) in enumerate(sizes):
        error = reference_size_error(width, height)
        if error is not None:
            raise InvalidParam(field if len(sizes) == 1 else f"{field}[{index}]", error)
