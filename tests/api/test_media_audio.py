"""MP4 with an AAC audio track muxed by PyAV: decoded back, the track has the sample rate given, the
video's length (within one AAC frame) and stays in sync with the frames; the video track is the
same H.264 stream as without audio."""

from __future__ import annotations

import io

import numpy as np
import pytest

from mstar.api.media import Mp4Writer, decode_mp4, decode_mp4_audio, encode_mp4

AAC_FRAME = 1024  # samples per AAC frame
FPS = 24
RATE = 24000
NUM_FRAMES = 49  # 2.04 s
MARK_S = 1.0  # a white frame and a tone burst start here


def _frames() -> np.ndarray:
    frames = np.full((NUM_FRAMES, 32, 48, 3), 30, dtype=np.uint8)
    frames[round(MARK_S * FPS) :] = 220  # the picture turns bright at the mark
    return frames


def _tone(num_samples: int, channels: int = 2) -> np.ndarray:
    """Silence, then a 440 Hz tone from MARK_S on (the right channel at half the level)."""
    t = np.arange(num_samples) / RATE
    tone = np.where(t >= MARK_S, 0.5 * np.sin(2 * np.pi * 440 * t), 0.0).astype(np.float32)
    return np.stack([tone, 0.5 * tone][:channels])


def _streams(data: bytes):
    import av

    with av.open(io.BytesIO(data)) as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        video_s = float(video.duration * video.time_base)
        audio_s = float(audio.duration * audio.time_base)
        packets = [bytes(p) for p in container.demux(video) if p.size]
        return video_s, audio_s, audio.sample_rate, audio.codec_context.name, audio.channels, packets


def test_audio_track_has_the_rate_and_the_videos_length():
    audio = _tone(round(NUM_FRAMES / FPS * RATE))
    data = encode_mp4(_frames(), FPS, audio=audio, audio_sample_rate=RATE)
    video_s, audio_s, rate, codec, channels, _ = _streams(data)
    assert (rate, codec, channels) == (RATE, "aac", 2)
    assert video_s == pytest.approx(NUM_FRAMES / FPS)
    assert abs(audio_s - video_s) <= AAC_FRAME / RATE
    waveform, decoded_rate = decode_mp4_audio(data)
    assert decoded_rate == RATE and waveform.shape[0] == 2
    assert abs(waveform.shape[1] - NUM_FRAMES / FPS * RATE) <= AAC_FRAME  # decoders give whole frames
    assert decode_mp4(data).shape == (NUM_FRAMES, 32, 48, 3)


def test_audio_stays_in_sync_with_the_frames():
    """The tone's onset and the bright frame are at the same time in the decoded file."""
    import av

    data = encode_mp4(_frames(), FPS, audio=_tone(round(NUM_FRAMES / FPS * RATE)), audio_sample_rate=RATE)
    with av.open(io.BytesIO(data)) as container:
        bright = next(f for f in container.decode(video=0) if f.to_ndarray(format="rgb24").mean() > 128)
        bright_s = float(bright.pts * bright.time_base)
    waveform, _ = decode_mp4_audio(data)
    onset_s = int(np.argmax(np.abs(waveform[0]) > 0.1)) / RATE
    assert bright_s == pytest.approx(MARK_S, abs=0.5 / FPS)
    assert abs(onset_s - MARK_S) <= AAC_FRAME / RATE  # priming samples are trimmed, not played
    assert np.abs(waveform[:, : int(0.9 * MARK_S * RATE)]).max() < 0.02  # silence before the mark
    ratio = np.abs(waveform[1]).max() / np.abs(waveform[0]).max()
    assert ratio == pytest.approx(0.5, abs=0.05)  # channels stay apart


@pytest.mark.parametrize("extra_samples", [-3000, 0, 5000])
def test_audio_is_cut_or_padded_to_the_videos_duration(extra_samples):
    exact = round(NUM_FRAMES / FPS * RATE)
    writer = Mp4Writer(FPS, audio_sample_rate=RATE)
    writer.write(_frames()[:20])
    audio = _tone(exact + extra_samples)
    writer.write_audio(audio[:, :1000])  # pieces are concatenated
    writer.write(_frames()[20:])
    writer.write_audio(audio[:, 1000:])
    assert writer.num_audio_samples == exact
    data = writer.finish()
    video_s, audio_s, *_ = _streams(data)
    assert abs(audio_s - video_s) <= AAC_FRAME / RATE


def test_the_video_track_is_unchanged_by_the_audio():
    frames = _frames()
    silent = encode_mp4(frames, FPS)
    with_audio = encode_mp4(frames, FPS, audio=_tone(RATE)[:1], audio_sample_rate=RATE)
    import av

    with av.open(io.BytesIO(silent)) as container:
        assert not container.streams.audio
        silent_packets = [bytes(p) for p in container.demux(container.streams.video[0]) if p.size]
    *_, channels, packets = _streams(with_audio)
    assert channels == 1  # mono in, mono track
    assert packets == silent_packets


def test_audio_misuse_is_refused():
    writer = Mp4Writer(FPS)
    writer.write(_frames()[:2])
    with pytest.raises(ValueError, match="no audio track"):
        writer.write_audio(np.zeros((2, 10), np.float32))
    writer.close()
    writer = Mp4Writer(FPS, audio_sample_rate=RATE)
    writer.write(_frames()[:2])
    with pytest.raises(ValueError, match="no audio was written"):
        writer.finish()
    with pytest.raises(ValueError, match="float \\[2, samples\\]"):
        writer.write_audio(np.zeros((3, 10), np.float32))
    with pytest.raises(ValueError, match="finite"):
        writer.write_audio(np.full((2, 10), np.nan, np.float32))
    writer.close()
    with pytest.raises(ValueError, match="audio_sample_rate"):
        Mp4Writer(FPS, audio_sample_rate=0)
    with pytest.raises(ValueError, match="both"):
        encode_mp4(_frames(), FPS, audio=_tone(100))
