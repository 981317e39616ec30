"""The adapter folder without torch: names only from the folder, headers read once per file
version, ranks and families from the keys, bad files described instead of raised."""

import os
import time

import pytest
import torch

from mstar.adapters import AdapterFileError, LoraCatalog, read_header, split_lora_key
from mstar.models.lora_families import LORA_KEY_RULES
from tests.lora_files import write_adapter


def _pair(module, rank):
    return {
        f"{module}.lora_down.weight": torch.zeros(rank, 8),
        f"{module}.lora_up.weight": torch.zeros(8, rank),
    }


def test_catalog_lists_files_and_folders_and_sees_new_ones(tmp_path):
    write_adapter(str(tmp_path / "one.safetensors"), _pair("lora_unet_layers_0_attention_to_q", 4))
    write_adapter(
        str(tmp_path / "two" / "pytorch_lora_weights.safetensors"),
        _pair("diffusion_model.double_blocks.0.img_attn.qkv", 16),
    )
    write_adapter(str(tmp_path / "bad name!.safetensors"), _pair("x", 2))
    catalog = LoraCatalog(str(tmp_path), LORA_KEY_RULES)
    infos = {info.name: info for info in catalog.scan()}
    assert sorted(infos) == ["one", "two"]
    assert (infos["one"].rank, infos["one"].family) == (4, "z-image")
    assert (infos["two"].rank, infos["two"].family) == (16, "flux.2")
    assert catalog.get("three") is None and catalog.get("../one") is None
    write_adapter(str(tmp_path / "three.safetensors"), _pair("diffusion_model.blocks.3.self_attn.q", 8))
    assert catalog.get("three").family == "wan2.2"  # dropped in while serving


def test_replaced_file_is_read_again(tmp_path):
    path = write_adapter(str(tmp_path / "a.safetensors"), _pair("transformer.x", 4))
    catalog = LoraCatalog(str(tmp_path))
    first = catalog.get("a")
    time.sleep(0.01)
    write_adapter(path, _pair("transformer.x", 8))
    os.utime(path, ns=(first.mtime_ns + 10**6, first.mtime_ns + 10**6))
    second = catalog.get("a")
    assert (first.rank, second.rank) == (4, 8) and first.version != second.version


def _header(raw: bytes) -> bytes:
    return len(raw).to_bytes(8, "little") + raw


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", "shorter than"),
        (b"\xff" * 8, "not a safetensors header"),
        (b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}", "not valid JSON"),
        (_header(b'{"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}'), "truncated"),
    ],
)
def test_bad_headers_are_described(tmp_path, content, words):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(AdapterFileError, match=words):
        read_header(str(path))
    assert words in LoraCatalog(str(tmp_path)).get("bad").error


@pytest.mark.parametrize(
    "key, expected",
    [
        ("transformer.blocks.0.attn1.to_q.lora_A.weight", ("blocks.0.attn1.to_q", "down")),
        ("base_model.model.layers.1.w1.lora_B.weight", ("layers.1.w1", "up")),
        ("lora_unet_blocks_0_ffn_0.alpha", ("blocks_0_ffn_0", "alpha")),
        ("diffusion_model.head.head.lora_up.weight", ("head.head", "up")),
        ("transformer.x.lora_magnitude_vector.dora_scale", None),
    ],
)
def test_split_lora_key(key, expected):
    assert split_lora_key(key) == expected


@pytest.mark.parametrize(
    "key",
    ["text_encoder.q.lora_A.weight", "transformer.x.lora_B.bias", "diffusion_model.x.diff_b", "x.lokr_w1"],
)
def test_unsupported_keys_are_refused(key):
    with pytest.raises(AdapterFileError):
        split_lora_key(key)
