"""Warmup requests run through the whole walk before the runtime reports ready, out of /metrics."""

import pytest

from mstar.config import ServerConfig
from mstar.models.registry import get_model_spec
from mstar.models.warmup import sized_warmup_requests
from mstar.runtime.runtime import Runtime
from tests.runtime.fake_models import BrokenWarmupSpec, WarmupSpec
from tests.runtime.helpers import make_config, run, wait_for
from tests.runtime.test_runtime import RecordingMetrics


def test_warmup_request_runs_every_node_before_ready_and_stays_out_of_metrics(loop, tmp_path):
    release_log = tmp_path / "released.log"
    metrics = RecordingMetrics()
    runtime = Runtime(make_config(api_key=str(release_log)), WarmupSpec(), metrics=metrics)
    labels = []
    try:
        run(loop, runtime.start(on_progress=lambda label, done, total: labels.append((label, done, total))))
        assert runtime.ready
        # every node released the warmup request's state (releases follow the end of the request)
        run(loop, wait_for(lambda: release_log.exists() and len(release_log.read_text().splitlines()) >= 3))
        lines = release_log.read_text().splitlines()
        assert {line.split()[1] for line in lines} >= {"encoder", "denoiser", "decoder"}
        assert {line.split()[2] for line in lines} == {"warmup-0"}
        # live bars: each part reports before it starts, not only once it is done
        warmup_bars = [entry for entry in labels if entry[0].startswith("warmup request")]
        assert warmup_bars[0] == ("warmup requests", 0, 1) and warmup_bars[-1] == ("warmup requests", 1, 1)
        assert ("warmup request 1", 1, 2) in warmup_bars  # its denoise steps, as they run
        for worker, node in ((0, "encoder"), (1, "denoiser"), (0, "decoder")):
            label = f"worker {worker}: warmup {node}"  # two workers: each bar names its worker
            assert labels.index((label, 0, 1)) < labels.index((label, 1, 1))
        assert metrics.ends == [] and metrics.steps == []
    finally:
        run(loop, runtime.shutdown(timeout_s=2.0))


def test_a_failing_warmup_request_fails_the_boot(loop):
    runtime = Runtime(make_config(), BrokenWarmupSpec())
    with pytest.raises(RuntimeError, match="warmup request 0"):
        run(loop, runtime.start())
    assert not runtime.ready


def test_sized_warmup_requests_cover_each_compile_size():
    spec = get_model_spec("wan2.2-ti2v-5b")
    requests = sized_warmup_requests(
        spec, ServerConfig(compile_sizes=["832x480x33", "480x832x33"]).compile_sizes
    )
    assert [(r.width, r.height, r.num_frames) for r in requests] == [(832, 480, 33), (480, 832, 33)]
    assert all(r.num_inference_steps == 2 for r in requests)
    assert sized_warmup_requests(get_model_spec("tiny-digits"), [])[0].width == 256


def test_a_compile_size_the_model_refuses_names_compile_sizes():
    with pytest.raises(ValueError, match="compile_sizes: '100x100'"):
        sized_warmup_requests(
            get_model_spec("z-image-turbo"), ServerConfig(compile_sizes=["100x100"]).compile_sizes
        )


def test_compile_sizes_are_parsed_once_in_the_config_and_written_back_as_text():
    config = ServerConfig(compile_sizes=["832x480x33", "1024x1024"])
    assert [(s.width, s.height, s.num_frames) for s in config.compile_sizes] == [
        (832, 480, 33),
        (1024, 1024, None),
    ]
    assert config.model_dump()["compile_sizes"] == ["832x480x33", "1024x1024"]
    assert ServerConfig.model_validate_json(config.model_dump_json()) == config
    with pytest.raises(ValueError, match="'WxH' or 'WxHxFRAMES', got '10x'"):
        ServerConfig(compile_sizes=["10x"])


def test_specs_skip_warmup_requests_when_warmup_is_off():
    assert get_model_spec("tiny-digits").warmup_requests(ServerConfig(warmup=False)) == []
