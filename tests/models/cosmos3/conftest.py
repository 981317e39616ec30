import pytest

from tests.models.cosmos3.tiny_folder import load_reference, write_tiny_folder


@pytest.fixture(scope="session")
def edge_folder(tmp_path_factory):
    """(folder, diffusers pipeline): the tiny Edge-like backbone with Edge's pipeline flags (no
    system prompt, the native flow schedule)."""
    pytest.importorskip("diffusers")
    folder = write_tiny_folder(
        tmp_path_factory.mktemp("cosmos3-edge"),
        "edge",
        default_use_system_prompt=False,
        use_native_flow_schedule=True,
    )
    return folder, load_reference(folder)


@pytest.fixture(scope="session")
def nano_folder(tmp_path_factory):
    """(folder, diffusers pipeline): the tiny Nano-like backbone, diffusers' default flags, and a
    Karras-spaced UniPC (which ignores any flow shift until a recipe's shift replaces it)."""
    pytest.importorskip("diffusers")
    folder = write_tiny_folder(tmp_path_factory.mktemp("cosmos3-nano"), "nano", use_karras_sigmas=True)
    return folder, load_reference(folder)
