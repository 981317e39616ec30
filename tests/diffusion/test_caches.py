"""Small caches the denoise path shares: per-size tables, and per-(request, label) text work."""

import torch

from mstar.diffusion.denoise import COND, UNCOND, DenoiseItem, kept_per_label
from mstar.diffusion.packing import bounded_cache_get


def test_bounded_cache_builds_once_and_drops_the_oldest():
    cache: dict = {}
    builds = []

    def build(value):
        return lambda: builds.append(value) or value

    assert bounded_cache_get(cache, "a", build(1), max_entries=2) == 1
    assert bounded_cache_get(cache, "a", build(99), max_entries=2) == 1  # kept: not rebuilt
    bounded_cache_get(cache, "b", build(2), max_entries=2)
    bounded_cache_get(cache, "c", build(3), max_entries=2)  # "a" is the oldest: it leaves
    assert list(cache) == ["b", "c"] and builds == [1, 2, 3]


def test_text_work_is_kept_per_label_in_the_requests_condition():
    condition: dict = {}
    calls = []

    def item(label):
        return DenoiseItem("r", label, torch.zeros(1), 1.0, 1.0, 0, None, condition)

    for _ in range(3):  # three steps
        for label in (COND, UNCOND):
            kept_per_label(item(label), "work", lambda label=label: calls.append(label) or label.upper())
    assert calls == [COND, UNCOND]
    assert condition["work"] == {COND: COND.upper(), UNCOND: UNCOND.upper()}
