"""The folder the parity hook writes with save_pretrained: its full-size config chains Gemma 3, the
connectors and the DiT (checked on the meta device: nothing allocated), and a tiny one is served
by `mstar serve --model-path` end to end, the loader path the GPU test runs at real size
(test_folder_gpu.py)."""

import pytest
import torch

from mstar.models.ltx2.config import to_json_dict
from mstar.models.ltx2.parity import FOLDER_GEMMA_LAYERS, folder_config
from mstar.models.ltx2.presets import LTX2, TINY
from tests.models.ltx2.served_folder import check_soundtrack, generate_video, serve_folder
from tests.models.ltx2.tiny_spec import TINY_LTX2_PATH

BOOT_TIMEOUT_S = 180.0  # a hang guard: the tiny server boots in seconds
REQUEST_TIMEOUT_S = 120.0
REQUEST = {"model": "ltx-2", "prompt": "a cat sings in the rain", "size": "64x32", "num_frames": 9, "fps": 8,
           "num_inference_steps": 2, "seed": 7}  # fmt: skip


def test_the_full_size_folder_is_the_released_model_with_a_shallow_gemma_of_its_width():
    diffusers = pytest.importorskip("diffusers")
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = folder_config()
    assert (config.dit, config.vae, config.audio_vae, config.vocoder) == (
        LTX2.dit, LTX2.vae, LTX2.audio_vae, LTX2.vocoder
    )  # fmt: skip
    with torch.device("meta"):
        gemma = Gemma3ForConditionalGeneration._from_config(Gemma3Config(**config.text_encoder))
        connectors = LTX2TextConnectors(**to_json_dict(config.connectors))
        dit = diffusers.LTX2VideoTransformer3DModel(**to_json_dict(config.dit))
    text = gemma.config.text_config
    released = LTX2.text_encoder["text_config"]
    assert text.num_hidden_layers == FOLDER_GEMMA_LAYERS
    assert (text.hidden_size, text.intermediate_size, text.num_attention_heads, text.head_dim) == (
        released["hidden_size"], released["intermediate_size"], released["num_attention_heads"], released["head_dim"]
    )  # fmt: skip
    # every hidden state (the embeddings and each layer's), stacked, is what the connectors take in
    assert connectors.text_proj_in.in_features == text.hidden_size * (text.num_hidden_layers + 1)
    assert connectors.text_proj_in.out_features == connectors.video_connector.inner_dim
    assert dit.caption_projection.linear_1.in_features == connectors.video_connector.inner_dim
    assert dit.audio_caption_projection.linear_1.in_features == connectors.audio_connector.inner_dim
    assert folder_config(tiny=True) is TINY


def test_a_tiny_folder_is_served_with_model_path_and_its_mp4_has_the_soundtrack(tmp_path):
    pytest.importorskip("diffusers")
    from mstar.models.ltx2.parity import write_ltx2_folder

    folder = tmp_path / "ltx2-tiny"
    write_ltx2_folder(folder_config(tiny=True), folder, "cpu", seed=0)
    log = tmp_path / "server.log"
    with serve_folder(TINY_LTX2_PATH, folder, log, "--no-warmup", boot_timeout_s=BOOT_TIMEOUT_S) as url:
        job, mp4 = generate_video(url, REQUEST, REQUEST_TIMEOUT_S)
    check_soundtrack(job, mp4, REQUEST, TINY.vocoder.output_sampling_rate, TINY.vocoder.out_channels)
