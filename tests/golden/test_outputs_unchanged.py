"""Seeded CPU outputs of tiny-digits, Wan2.2 and Z-Image (tiny configs, seeded random weights) are
byte-identical to the ones recorded in expected_sha256.json: final latents and uint8 frames of
text-to-video, image-to-video and text-to-image, with and without guidance, alone and packed with
other requests. A change that moves any bit of a model's arithmetic fails here; a change meant to
move them rewrites the file (`python -m tests.golden.outputs --write`) and says why in its commit.

The outputs are computed in a subprocess whose numerics are pinned before torch loads (see
tests/golden/outputs.py), so the same hashes hold on any x86-64 CPU, under load, at any core.
"""

import json
import subprocess
import sys

import pytest

from tests.golden.outputs import EXPECTED_PATH, REPO_ROOT, pinned_env


@pytest.fixture(scope="module")
def computed() -> dict[str, str]:
    result = subprocess.run(
        [sys.executable, "-m", "tests.golden.outputs"],
        cwd=REPO_ROOT, env=pinned_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)


EXPECTED = json.loads(EXPECTED_PATH.read_text())


def test_every_case_is_computed(computed):
    assert sorted(computed) == sorted(EXPECTED)


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_output_is_byte_identical(computed, case):
    assert computed.get(case) == EXPECTED[case], f"{case} changed"
