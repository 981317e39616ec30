import pytest

from tests.models.ltx2.tiny_parts import save_tiny_pipeline


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """(folder, pipeline): the tiny LTX2Pipeline written with save_pretrained."""
    pytest.importorskip("diffusers")  # the parity reference; absent on some GPU hosts
    folder = tmp_path_factory.mktemp("ltx2-tiny")
    pipe = save_tiny_pipeline(folder)
    return folder, pipe
