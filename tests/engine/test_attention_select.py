"""Boot-time backend selection, the boot check, and each boot error message."""

from __future__ import annotations

import logging

import pytest
import torch

from mstar.engine.attention import AttentionLayout, build_attention
from mstar.engine.workspace import release_workspaces
from tests.engine.attention_fakes import AMPERE, CPU, HOPPER, FakeFA3, FakeFlashInfer, random_qkv


def build(backend="auto", platform=HOPPER, fa3=None, flashinfer=None, workspace_mb=1, **kwargs):
    libraries = {"fa3": fa3, "flashinfer": flashinfer}
    return build_attention(
        backend,
        "cpu",
        torch.float32,
        workspace_mb=workspace_mb,
        libraries=libraries,
        platform=platform,
        **kwargs,
    )


def test_auto_takes_fa3_on_hopper(caplog):
    fa3 = FakeFA3()
    with caplog.at_level(logging.INFO, logger="mstar.engine.attention"):
        attention = build(fa3=fa3, flashinfer=FakeFlashInfer())
    assert attention.backend_name == "fa3"
    assert fa3.calls, "boot ran a plan-and-run through the kernel"
    assert "attention backend: fa3" in caplog.text and "NVIDIA H200 (sm_90)" in caplog.text


def test_auto_takes_flashinfer_without_fa3():
    assert build(fa3=None, flashinfer=FakeFlashInfer()).backend_name == "flashinfer"


def test_auto_skips_fa3_off_hopper(caplog):
    with caplog.at_level(logging.INFO, logger="mstar.engine.attention"):
        attention = build(platform=AMPERE, fa3=FakeFA3(), flashinfer=FakeFlashInfer())
    assert attention.backend_name == "flashinfer"
    assert "skipping fa3: FA3 kernels need a Hopper GPU" in caplog.text


def test_auto_on_cpu_is_torch():
    assert build(platform=CPU, fa3=FakeFA3(), flashinfer=FakeFlashInfer()).backend_name == "torch"


def test_auto_without_libraries_is_torch():
    assert build(fa3=None, flashinfer=None).backend_name == "torch"


def test_auto_moves_on_when_a_backend_fails_its_boot_check(caplog):
    with caplog.at_level(logging.WARNING, logger="mstar.engine.attention"):
        attention = build(fa3=FakeFA3(wrong_answers=True), flashinfer=FakeFlashInfer())
    assert attention.backend_name == "flashinfer"
    assert "fa3 failed its boot check" in caplog.text


def test_boot_label_is_discarded_after_the_check():
    attention = build(fa3=FakeFA3())
    assert attention.labels() == []


def test_explicit_fa3_on_cpu_names_backend_device_version():
    with pytest.raises(ValueError) as error:
        build("fa3", platform=CPU, fa3=FakeFA3())
    message = str(error.value)
    assert "'fa3'" in message and "cpu" in message and "fa3-fwd 0.0.3+fake" in message


def test_explicit_fa3_off_hopper():
    with pytest.raises(ValueError) as error:
        build("fa3", platform=AMPERE, fa3=FakeFA3())
    message = str(error.value)
    assert "'fa3'" in message and "NVIDIA A100 (sm_80)" in message and "Hopper" in message
    assert "fa3-fwd 0.0.3+fake" in message


def test_explicit_fa3_not_installed():
    with pytest.raises(ValueError) as error:
        build("fa3", fa3=None)
    message = str(error.value)
    assert "'fa3'" in message and "NVIDIA H200" in message and "fa3-fwd not installed" in message


def test_explicit_flashinfer_not_installed():
    with pytest.raises(
        ValueError, match=r"'flashinfer' cannot run on NVIDIA H200.*flashinfer-python not installed"
    ):
        build("flashinfer", flashinfer=None)


def test_backend_typo_lists_the_choices_and_versions():
    with pytest.raises(ValueError) as error:
        build("fa4", fa3=FakeFA3(), flashinfer=None)
    message = str(error.value)
    assert "'fa4' is unknown" in message and "NVIDIA H200" in message
    assert f"torch {torch.__version__}" in message and "fa3-fwd 0.0.3+fake" in message
    assert "flashinfer-python not installed" in message


def test_flashinfer_kernel_the_gpu_lacks_fails_boot():
    flashinfer = FakeFlashInfer(missing_kernels=("fa3",))
    with pytest.raises(ValueError) as error:
        build("flashinfer", platform=AMPERE, flashinfer=flashinfer, flashinfer_backend="fa3")
    message = str(error.value)
    assert "'flashinfer'" in message and "NVIDIA A100 (sm_80)" in message
    assert "flashinfer 0.7.2+fake (kernel backend fa3)" in message
    assert "no fa3 kernel" in message


def test_flashinfer_kernel_backend_reaches_the_library():
    flashinfer = FakeFlashInfer()
    build("flashinfer", flashinfer=flashinfer, flashinfer_backend="cudnn")
    assert {wrapper.backend for wrapper in flashinfer.wrappers} == {"cudnn"}


def test_flashinfer_backend_typo():
    with pytest.raises(ValueError, match="flashinfer_backend 'fa9' is unknown.*NVIDIA H200"):
        build("flashinfer", flashinfer=FakeFlashInfer(), flashinfer_backend="fa9")


def test_explicit_backend_with_wrong_answers_fails_boot():
    with pytest.raises(ValueError) as error:
        build("fa3", fa3=FakeFA3(wrong_answers=True))
    message = str(error.value)
    assert "'fa3' failed its boot check on NVIDIA H200 (sm_90)" in message
    assert "relative error" in message and "fa3-fwd 0.0.3+fake" in message


def test_all_wrappers_share_one_workspace():
    flashinfer = FakeFlashInfer()
    workspace = torch.empty(1024, dtype=torch.uint8)
    attention = build("flashinfer", flashinfer=flashinfer, workspace=workspace)
    for label in ("self", "cross"):
        layout = AttentionLayout.self_attention((3, 4))
        attention.plan(label, layout)
        attention.run(label, *random_qkv(layout))
    assert attention.workspace is workspace
    assert len(flashinfer.wrappers) >= 3
    assert all(wrapper.workspace is workspace for wrapper in flashinfer.wrappers)


def test_default_workspace_is_shared_per_device():
    release_workspaces()
    attention = build(fa3=FakeFA3(), workspace_mb=3)
    assert attention.workspace.dtype == torch.uint8
    assert attention.workspace.numel() == 3 * 1024 * 1024
    assert build(fa3=FakeFA3(), workspace_mb=2).workspace is attention.workspace
    release_workspaces()
