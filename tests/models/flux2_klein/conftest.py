import pytest

from tests.models.flux2_klein.tiny_parts import save_tiny_pipeline


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """(folder, pipeline): the tiny distilled klein pipeline written with save_pretrained and
    loaded back with Flux2KleinPipeline.from_pretrained (the reference every test compares with)."""
    pytest.importorskip("diffusers")  # the parity reference; absent on some GPU hosts
    from diffusers import Flux2KleinPipeline

    folder = tmp_path_factory.mktemp("flux2-klein-tiny")
    save_tiny_pipeline(folder, is_distilled=True)
    return folder, Flux2KleinPipeline.from_pretrained(str(folder)).to("cpu")
