"""LTX-2 served end to end on CPU: the tiny save_pretrained folder loaded by the real node builders in
the real Runtime's workers, behind the app on a live server, driven by the official `openai` client;
the MP4 decoded with PyAV: H.264 frames of the asked size and count, an AAC track at the vocoder's
rate as long as the video (within one AAC frame), none with "audio": false."""

from __future__ import annotations

import io
import time

import av
import pytest

from mstar.api.media import decode_mp4, decode_mp4_audio
from mstar.models.ltx2.presets import TINY
from tests.models.ltx2.tiny_spec import TINY_LTX2_PATH, TinyLTX2Spec
from tests.serving.test_models_over_http import live_server, openai_client

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks videos.* deprecated
MAX_VIDEO_WAIT_S = 120.0
AAC_FRAME = 1024


def _wait(client, video):
    deadline = time.monotonic() + MAX_VIDEO_WAIT_S
    while video.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.05)
        video = client.videos.retrieve(video.id)
    assert video.status == "completed", video
    return video


def test_ltx2_makes_an_mp4_with_its_soundtrack_over_http(tiny_folder):
    folder, _ = tiny_folder
    fields = {"num_frames": 9, "fps": 8, "num_inference_steps": 2, "seed": 7}
    with live_server(TinyLTX2Spec(), TINY_LTX2_PATH, folder) as server:
        client = openai_client(server)
        video = client.videos.create(model="ltx-2", prompt="a cat sings", size="64x32", extra_body=fields)
        silent = client.videos.create(
            model="ltx-2", prompt="a cat sings", size="64x32", extra_body={**fields, "audio": False}
        )
        video, silent = _wait(client, video), _wait(client, silent)
        mp4 = client.videos.download_content(video.id).read()
        silent_mp4 = client.videos.download_content(silent.id).read()
    rate = TINY.vocoder.output_sampling_rate
    assert video.to_dict()["audio"] == {"sample_rate": rate, "seconds": 9 / 8, "codec": "aac"}
    assert "audio" not in silent.to_dict()
    frames = decode_mp4(mp4)
    assert frames.shape == (9, 32, 64, 3) and frames.std() > 0
    with av.open(io.BytesIO(mp4)) as container:
        (video_stream,), (audio_stream,) = container.streams.video, container.streams.audio
        assert video_stream.codec_context.name == "h264" and audio_stream.codec_context.name == "aac"
    waveform, sample_rate = decode_mp4_audio(mp4)
    assert sample_rate == rate and waveform.shape[0] == TINY.vocoder.out_channels
    assert abs(waveform.shape[1] - 9 / 8 * rate) <= AAC_FRAME  # as long as the video
    assert waveform.std() > 0
    with av.open(io.BytesIO(silent_mp4)) as container:
        assert len(container.streams.video) == 1 and not container.streams.audio
    assert (decode_mp4(silent_mp4) == frames).all()  # the audio decode changes no frame


def test_mstar_generate_writes_the_soundtrack_into_the_mp4(tiny_folder, tmp_path):
    from mstar import cli

    folder, _ = tiny_folder
    rate = TINY.vocoder.output_sampling_rate
    common = ["--model-path", str(folder), "--prompt", "a cat sings", "--steps", "2", "--num-frames", "9",
              "--fps", "8", "--size", "64x32", "--seed", "7"]  # fmt: skip
    with_audio, silent = tmp_path / "song.mp4", tmp_path / "silent.mp4"
    assert cli.main(["generate", TINY_LTX2_PATH, *common, "-o", str(with_audio)]) == 0
    assert cli.main(["generate", TINY_LTX2_PATH, *common, "--no-audio", "-o", str(silent)]) == 0
    waveform, sample_rate = decode_mp4_audio(with_audio.read_bytes())
    assert sample_rate == rate and abs(waveform.shape[1] - 9 / 8 * rate) <= AAC_FRAME and waveform.std() > 0
    with av.open(io.BytesIO(silent.read_bytes())) as container:
        assert not container.streams.audio
    assert (decode_mp4(silent.read_bytes()) == decode_mp4(with_audio.read_bytes())).all()
