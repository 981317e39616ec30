"""Our parallel PNG writer: valid files (Pillow decodes and verifies them), the exact pixels, bytes that
depend on the image only, and compression that still works on smooth images."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from mstar.api.png import NUM_STRIPS, adler32_combine, encode_png, sub_filtered_rows


def decoded(png: bytes) -> np.ndarray:
    Image.open(io.BytesIO(png)).verify()  # chunk CRCs and structure
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def smooth_image(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], -1).astype(
        np.uint8
    )


@pytest.mark.parametrize(
    "shape", [(1, 1), (1, 17), (17, 1), (3, 5), (NUM_STRIPS - 1, 9), (64, 48), (1024, 1024)]
)
def test_pillow_reads_back_the_exact_pixels(shape):
    rng = np.random.default_rng(sum(shape))
    for image in (rng.integers(0, 256, (*shape, 3), dtype=np.uint8), smooth_image(*shape)):
        png = encode_png(image)
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        np.testing.assert_array_equal(decoded(png), image)


def test_bytes_depend_on_the_image_only():
    image = np.random.default_rng(0).integers(0, 256, (257, 130, 3), dtype=np.uint8)
    assert len({encode_png(image) for _ in range(4)}) == 1
    assert encode_png(image) == encode_png(np.asfortranarray(image))  # memory layout does not matter


def test_smooth_images_compress_and_the_level_is_used():
    image = smooth_image(512, 512)
    fastest, smallest = encode_png(image, level=1), encode_png(image, level=9)
    assert len(fastest) < 0.25 * image.nbytes  # the Sub filter turns a gradient into runs
    assert len(smallest) <= len(fastest)
    np.testing.assert_array_equal(decoded(smallest), image)


def test_sub_filter_is_the_left_difference_mod_256():
    image = np.array([[[10, 20, 30], [5, 25, 255], [0, 0, 1]]], dtype=np.uint8)
    rows = sub_filtered_rows(image)
    assert rows.tolist() == [[1, 10, 20, 30, 251, 5, 225, 251, 231, 2]]
    assert zlib.decompress(zlib.compress(rows.tobytes())) == rows.tobytes()


@pytest.mark.parametrize(
    "bad", [np.zeros((4, 4, 3), np.float32), np.zeros((4, 4), np.uint8), np.zeros((4, 4, 4), np.uint8)]
)
def test_rejects_what_is_not_uint8_rgb(bad):
    with pytest.raises(ValueError, match="uint8"):
        encode_png(bad)


def test_adler32_of_joined_strips_is_combined_from_theirs():
    rng = np.random.default_rng(3)
    for first_length, second_length in ((0, 5), (1, 1), (7, 0), (70_000, 130_000), (5_552, 65_521 * 2 + 3)):
        first = rng.integers(0, 256, first_length, dtype=np.uint8).tobytes()
        second = rng.integers(0, 256, second_length, dtype=np.uint8).tobytes()
        combined = adler32_combine(zlib.adler32(first), zlib.adler32(second), len(second))
        assert combined == zlib.adler32(first + second)
    assert adler32_combine(zlib.adler32(b"\xff" * 9000), zlib.adler32(b"\xff" * 9000), 9000) == zlib.adler32(
        b"\xff" * 18000
    )
