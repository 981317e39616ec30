"""Edit requests' reference images are refused before any work, naming the field."""

import pytest

from mstar.errors import InvalidParam
from mstar.models.flux2_klein.edits import check_reference_images
from mstar.models.flux2_klein.geometry import MAX_REFERENCE_IMAGES


def test_accepts_up_to_the_limit():
    check_reference_images([(1024, 768)] * MAX_REFERENCE_IMAGES)
    check_reference_images([(64, 512)])  # 8:1 is allowed


@pytest.mark.parametrize(
    "sizes, param, message",
    [
        ([], "image", "at least one"),
        ([(512, 512)] * (MAX_REFERENCE_IMAGES + 1), "image", f"at most {MAX_REFERENCE_IMAGES} images"),
        ([(63, 512)], "image", "at least 64 pixels"),
        ([(512, 512), (64, 600)], "image[1]", "aspect ratio"),
    ],
)
def test_refuses_naming_the_field(sizes, param, message):
    with pytest.raises(InvalidParam, match=message) as caught:
        check_reference_images(sizes)
    assert caught.value.param == param
