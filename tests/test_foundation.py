"""The package's promises that every later change must keep."""

import subprocess
import sys

import pytest

from mstar.config import NodeGroup, ServerConfig, load_config


def test_import_mstar_is_light():
    code = (
        "import sys, mstar, mstar.config, mstar.graph, mstar.errors;"
        "heavy = [m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_config_rejects_unknown_key_naming_it():
    with pytest.raises(ValueError, match="attention_backnd"):
        ServerConfig(attention_backnd="fa3")


def test_config_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: tiny-digits\nport: 9001\nworkspace_mb: 64\n")
    config = load_config(path, port=9002, api_key=None)
    assert config.port == 9002 and config.workspace_mb == 64 and config.api_key is None


def test_placement_errors_name_the_node():
    config = ServerConfig(node_groups=[NodeGroup(nodes=["dit"])])
    with pytest.raises(ValueError, match="vae_decoder"):
        config.placement(("dit", "vae_decoder"))
    with pytest.raises(ValueError, match="bogus"):
        ServerConfig(node_groups=[NodeGroup(nodes=["dit", "vae_decoder", "bogus"])]).placement(
            ("dit", "vae_decoder")
        )


def test_bad_device_is_rejected():
    with pytest.raises(ValueError, match="device"):
        ServerConfig(device="tpu")
