"""torch tensors (bf16 included) crossing worker processes, on CPU and on a GPU."""

import numpy as np
import pytest

from mstar.config import NodeGroup
from mstar.runtime.runtime import Runtime
from tests.runtime.fake_models import FakeParams, TorchSpec
from tests.runtime.helpers import make_config, run


def _groups(device: str) -> list[NodeGroup]:
    return [NodeGroup(device=device, nodes=["make", "finish"]), NodeGroup(device=device, nodes=["scale"])]


def _check_bf16_round_trip(loop, device: str) -> None:
    runtime = Runtime(make_config(node_groups=_groups(device)), TorchSpec())
    run(loop, runtime.start(), timeout_s=120.0)
    try:
        outputs = run(loop, runtime.submit(FakeParams(seed=3, steps=2)).result(), timeout_s=60.0)
    finally:
        run(loop, runtime.shutdown(timeout_s=2.0))
    expected = np.arange(6, dtype=np.float32).reshape(2, 3) * 3 * 4
    assert outputs["x"].dtype == np.float32  # bf16 widened for the API
    np.testing.assert_array_equal(outputs["x"], expected)
    assert outputs["frames"].dtype == np.uint8
    np.testing.assert_array_equal(outputs["frames"].reshape(2, 3), expected.astype(np.uint8))


def test_bf16_torch_tensors_cross_workers_on_cpu(loop):
    pytest.importorskip("torch")
    _check_bf16_round_trip(loop, "cpu")


@pytest.mark.gpu
def test_bf16_torch_tensors_cross_workers_on_cuda(loop):
    _check_bf16_round_trip(loop, "cuda:0")
