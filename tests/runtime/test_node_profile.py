"""MSTAR_PROFILE_NODES: the named nodes' forwards are profiled into one text file per node and
worker; other nodes, and a worker without the variable, write nothing."""

from mstar.runtime.node_profile import DIR_ENV, NODES_ENV, NodeProfiler


def _busy_encoder_step() -> int:
    return sum(i * i for i in range(20_000))


def test_named_nodes_are_profiled_into_a_file_each(tmp_path, monkeypatch):
    monkeypatch.setenv(NODES_ENV, "text_encoder, dit")
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    profiler = NodeProfiler.from_env(worker=3)
    for _ in range(2):
        with profiler.around("text_encoder"):
            _busy_encoder_step()
    with profiler.around("vae_decoder"):
        _busy_encoder_step()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["text_encoder-worker3.txt"]
    report = (tmp_path / "text_encoder-worker3.txt").read_text()
    assert report.startswith("text_encoder on worker 3: 2 forward(s)")
    assert "_busy_encoder_step" in report


def test_without_the_variable_nothing_is_profiled(tmp_path, monkeypatch):
    monkeypatch.delenv(NODES_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    profiler = NodeProfiler.from_env(worker=0)
    with profiler.around("text_encoder"):
        _busy_encoder_step()
    assert list(tmp_path.iterdir()) == []


def test_a_failing_forward_is_still_counted(tmp_path, monkeypatch):
    monkeypatch.setenv(NODES_ENV, "dit")
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    profiler = NodeProfiler.from_env(worker=0)
    try:
        with profiler.around("dit"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert (tmp_path / "dit-worker0.txt").read_text().startswith("dit on worker 0: 1 forward(s)")
