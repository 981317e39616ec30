"""The family scaffold's promises: every family is registered with its spec (and, for the DiT
and text families, a bench entry), specs validate into their frozen params Struct, geometry is torch-free
and the one source of tokens and labels, nothing in mstar/ branches on a family's name, and no
file of mstar/ passes 400 lines."""

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from mstar.config import ServerConfig
from mstar.errors import InvalidParam
from mstar.graph import COND, UNCOND, GenerationParams
from mstar.models.bench_entry import DitBenchEntry, TextBenchEntry
from mstar.models.registry import MODELS, bench_entries, bench_entry, get_model_spec
from mstar.params import RequestParams, decode_params, encode_params

REPO = Path(__file__).resolve().parents[2]
MAX_FILE_LINES = 400
IMAGE_AND_VIDEO = sorted(name for name in MODELS if get_model_spec(name).output_kind != "text")
TEXT = sorted(name for name in MODELS if get_model_spec(name).output_kind == "text")


def test_no_family_branches_and_no_long_files_in_mstar():
    sources = sorted((REPO / "mstar").rglob("*.py"))
    branching = [str(p.relative_to(REPO)) for p in sources if "family ==" in p.read_text()]
    long_files = [
        str(p.relative_to(REPO)) for p in sources if len(p.read_text().splitlines()) > MAX_FILE_LINES
    ]
    assert branching == [] and long_files == []


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_spec_names_a_params_struct(name):
    spec = get_model_spec(name)
    assert issubclass(spec.params_type, RequestParams) and spec.params_type.__struct_config__.frozen


@pytest.mark.parametrize("name", IMAGE_AND_VIDEO)
def test_each_spec_validates_into_its_frozen_params_struct(name):
    spec = get_model_spec(name)
    params = spec.validate(GenerationParams(prompt="a fox", seed=3))
    assert type(params) is spec.params_type and isinstance(params, RequestParams)
    with pytest.raises(AttributeError):
        params.seed = 4  # frozen
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=spec.params_type) == params
    assert spec.output_kind in ("image", "video", "video+audio", "text")


@pytest.mark.parametrize("name", TEXT)
def test_text_specs_refuse_image_fields_and_carry_their_params_struct(name):
    spec = get_model_spec(name)
    with pytest.raises(InvalidParam) as refused:
        spec.validate(GenerationParams(prompt="a fox", seed=3))
    assert refused.value.param == "model"
    (warmup,) = spec.warmup_requests(ServerConfig(model=name, random_weights=True))
    assert type(warmup) is spec.params_type
    assert decode_params(encode_params(warmup), spec.params_type) == warmup  # as RunWalk carries it
    assert isinstance(bench_entry(name), TextBenchEntry)


@pytest.mark.parametrize("name", IMAGE_AND_VIDEO)
def test_the_spec_and_its_geometry_count_the_same_step_tokens(name):
    spec = get_model_spec(name)
    without = {spec.geometry.labels(g) for g in (0.0, 1.0)}  # no guidance, in one rule or another
    guided = spec.geometry.labels(5.0)
    # the conditioned pass leads; guidance adds the unconditional one after it (a family may add
    # its own: LTX-2's audio guidance keeps "uncond" at any video scale, then a modality pass); a
    # step-distilled checkpoint ignores guidance
    assert all(labels[0] == COND for labels in without)
    assert guided == (COND,) or guided[:2] == (COND, UNCOND)
    for guidance in (0.0, 1.0, 5.0):
        params = spec.validate(GenerationParams(prompt="p", guidance_scale=guidance, seed=1))
        labels = spec.geometry.labels(params.guidance_scale)
        assert spec.step_tokens(params) % len(labels) == 0


def test_geometry_and_specs_import_without_torch():
    code = (
        "import sys\n"
        "from mstar.models.registry import MODELS, get_model_spec\n"
        "[get_model_spec(name) for name in MODELS]\n"
        "import mstar.models.wan22.geometry, mstar.models.zimage.geometry, mstar.models.tiny_digits.geometry\n"
        "import mstar.models.wan22.bench, mstar.models.zimage.bench, mstar.models.qwen3.bench\n"
        "import mstar.models.ltx2.geometry, mstar.models.ltx2.bench\n"
        "import mstar.models.flux2_klein.geometry, mstar.models.flux2_klein.bench\n"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.stdout.strip() == "False", result.stderr


def test_bench_entries_come_from_the_registry_with_unique_workload_names():
    entries = bench_entries()
    assert [entry.family for entry in entries] == ["wan", "zimage", "cosmos3", "ltx2", "flux2-klein", "qwen3"]
    assert [isinstance(entry, DitBenchEntry) for entry in entries] == [True] * 5 + [False]
    assert isinstance(entries[5], TextBenchEntry)
    names = [w.name for entry in entries for w in (*entry.step_workloads, *entry.e2e_workloads)]
    assert len(names) == len(set(names))
