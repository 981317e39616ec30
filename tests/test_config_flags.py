"""ServerConfig's keys as flags, generated from the schema: every key, any new key, over the YAML."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from mstar import __version__, cli
from mstar.config import ServerConfig
from mstar.config_flags import add_config_flags, config_overrides


def _parse(schema, argv):
    parser = argparse.ArgumentParser()
    add_config_flags(parser, schema)
    return config_overrides(parser.parse_args(argv))


def test_every_key_has_a_flag_with_its_description_as_help():
    parser = argparse.ArgumentParser()
    add_config_flags(parser, ServerConfig)
    help_text = " ".join(parser.format_help().split())
    for name, field in ServerConfig.model_fields.items():
        assert field.description, f"ServerConfig.{name} has no description (its flag's help)"
        assert f"--{name.replace('_', '-')}" in help_text
        assert " ".join(field.description.split()[:4]) in help_text
    assert _parse(ServerConfig, []) == {}  # nothing typed, nothing overridden


class _NewSection(BaseModel):
    limit: int = 1


class _ExtendedConfig(ServerConfig):
    """Keys another change may add: each gets its flag without code of its own."""

    shutdown_grace_s: float = Field(5.0, description="seconds to finish in-flight requests")
    heartbeat_checks: bool = Field(True, description="watch workers")
    allowed_hosts: list[str] = Field([], description="Host headers accepted")
    kv_page_sizes: list[int] = Field([16], description="pages")
    kv_dtype: Literal["auto", "fp8"] = Field("auto", description="KV cache dtype")
    public_url: str | None = Field(None, description="URL media links use")
    section: _NewSection = Field(_NewSection(), description="a nested block")


def test_a_new_key_of_any_type_gets_its_flag():
    argv = [
        "--shutdown-grace-s", "2.5", "--no-heartbeat-checks",
        "--allowed-hosts", "a.example,b.example", "--allowed-hosts", "c.example",
        "--kv-page-sizes", "16,32", "--kv-dtype", "fp8", "--public-url", "https://x.example",
        "--section", '{"limit": 4}', "--compile-sizes", "832x480x33",
    ]  # fmt: skip
    overrides = _parse(_ExtendedConfig, argv)
    assert overrides == {
        "shutdown_grace_s": 2.5,
        "heartbeat_checks": False,
        "allowed_hosts": ["a.example", "b.example", "c.example"],
        "kv_page_sizes": [16, 32],
        "kv_dtype": "fp8",
        "public_url": "https://x.example",
        "section": {"limit": 4},
        "compile_sizes": ["832x480x33"],
    }
    config = _ExtendedConfig(**overrides)
    assert config.section.limit == 4 and config.heartbeat_checks is False


def test_a_bad_flag_value_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit):
        _parse(_ExtendedConfig, ["--kv-dtype", "int3"])
    with pytest.raises(SystemExit):
        _parse(_ExtendedConfig, ["--section", "{not json"])
    assert "not JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse(_ExtendedConfig, ["--kv-page-sizes", "16,big"])
    assert "--kv-page-sizes: invalid value 'big'" in capsys.readouterr().err


def test_flags_override_the_yaml_and_the_positional_model_wins(tmp_path, monkeypatch):
    monkeypatch.delenv(cli.API_KEY_ENV, raising=False)
    path = tmp_path / "server.yaml"
    path.write_text("port: 9001\nworkspace_mb: 64\nwarmup: false\ncompile_sizes: [1024x1024]\n")
    args = cli.build_parser().parse_args(
        ["serve", "z-image-turbo", "--config", str(path), "--port", "9002", "--warmup", "--model", "x"]
    )
    config = cli.load_server_config(args)
    assert (config.model, config.port, config.workspace_mb) == ("z-image-turbo", 9002, 64)
    assert config.warmup is True and [str(size) for size in config.compile_sizes] == ["1024x1024"]


def test_the_api_key_flag_beats_the_environment(monkeypatch):
    monkeypatch.setenv(cli.API_KEY_ENV, "from-env")
    assert cli.load_server_config(cli.build_parser().parse_args(["serve"])).api_key == "from-env"
    args = cli.build_parser().parse_args(["serve", "--api-key", "from-flag"])
    assert cli.load_server_config(args).api_key == "from-flag"


def test_generate_takes_the_config_flags_beside_its_own():
    args = cli.build_parser().parse_args(
        ["generate", "tiny-digits", "--prompt", "a 3", "-o", "x.png", "--seed", "3", "--no-warmup"]
    )
    assert args.seed == 3 and cli.load_server_config(args).warmup is False


def test_version_and_an_unknown_model_lists_the_served_ones(capsys):
    out = subprocess.run([sys.executable, "-m", "mstar.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"mstar {__version__}"
    assert cli.main(["generate", "no-such-model", "--prompt", "x", "-o", "x.png"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "tiny-digits" in err and "z-image-turbo" in err
