"""The FLOP counter of each family's bench entry against hand counts and torch's own count."""

from __future__ import annotations

import pytest

from mstar.bench.baseline import diffusers_transformer, step_workloads
from mstar.models.flops import FlopCount
from mstar.models.geometry import Segment
from mstar.models.wan22.bench import WanBench
from mstar.models.wan22.config import Wan22Config
from mstar.models.wan22.geometry import WanGeometry
from mstar.models.zimage.bench import ZImageBench
from mstar.models.zimage.config import REAL
from mstar.models.zimage.geometry import ZImageGeometry, padded_len

SMALL_WAN = {
    "patch_size": [1, 2, 2],
    "num_attention_heads": 2,
    "attention_head_dim": 4,
    "in_channels": 3,
    "out_channels": 3,
    "text_dim": 5,
    "freq_dim": 6,
    "ffn_dim": 16,
    "num_layers": 2,
}


def test_small_wan_by_hand():
    # dim 8, 10 latent tokens, 7 text tokens, 2 layers
    count = WanBench().count_flops(SMALL_WAN, [Segment(image_tokens=10, text_tokens=7)])
    per_layer_gemm = (
        4 * 2 * 10 * 8 * 8  # self q, k, v, out: 2560
        + 2 * 2 * 10 * 8 * 8  # cross q, out on latent tokens: 2560
        + 2 * 2 * 7 * 8 * 8  # cross k, v on text tokens: 1792
        + 2 * 2 * 10 * 8 * 16  # FFN up and down: 5120
    )
    embed_gemm = (
        2 * 10 * 12 * 8  # patch embedding: 3 channels x 1x2x2 patch -> 8
        + 2 * 7 * 5 * 8  # text projection layer 1
        + 2 * 7 * 8 * 8  # text projection layer 2
        + 2 * 1 * 6 * 8  # time embedder layer 1 (one timestep)
        + 2 * 1 * 8 * 8  # time embedder layer 2
        + 2 * 1 * 8 * 48  # modulation projection to 6 x dim
        + 2 * 10 * 8 * 12  # proj_out
    )
    per_layer_attention = 4 * 10 * 10 * 2 * 4 + 4 * 10 * 7 * 2 * 4  # self (QK^T + PV) and cross
    assert count.gemm == 2 * per_layer_gemm + embed_gemm
    assert count.attention == 2 * per_layer_attention
    assert count.total == count.gemm + count.attention


def test_packed_segments_attend_only_to_themselves():
    one = WanBench().count_flops(SMALL_WAN, [Segment(10, 7)])
    two = WanBench().count_flops(SMALL_WAN, [Segment(10, 7), Segment(10, 7)])
    assert two.attention == 2 * one.attention  # not (20 tokens)^2
    assert two.gemm == 2 * one.gemm


def test_zimage_refiners_and_swiglu_by_hand():
    config = {"dim": 8, "n_heads": 2, "n_kv_heads": 2, "n_layers": 1, "n_refiner_layers": 1, "in_channels": 1,
              "cap_feat_dim": 4, "axes_dims": [2, 1, 1]}  # fmt: skip
    image, text = 6, 2
    ffn_dim = 21  # int(8 / 3 * 8), three SwiGLU matrices

    def block(tokens: int) -> tuple[int, int]:
        return 4 * 2 * tokens * 64 + 3 * 2 * tokens * 8 * ffn_dim, 4 * tokens * tokens * 2 * 4

    gemm = block(image)[0] + block(text)[0] + block(image + text)[0]
    gemm += 2 * image * 4 * 8 + 2 * text * 4 * 8 + 2 * (image + text) * 8 * 4  # x/cap embed, final
    # per item: timestep MLP 256 -> 1024 -> 8 (adaLN width = min(dim, 256)), 4-way modulation of the
    # refiner and the main layer (8 -> 32), final scale (8 -> 8)
    gemm += 2 * 256 * 1024 + 2 * 1024 * 8 + 2 * (2 * 8 * 32) + 2 * 8 * 8
    attention = block(image)[1] + block(text)[1] + block(image + text)[1]
    count = ZImageBench().count_flops(config, [Segment(image, text)])
    assert (count.gemm, count.attention) == (gemm, attention)


def test_real_shapes_from_the_families_geometry_and_roofline():
    wan = WanGeometry.of(Wan22Config())
    assert wan.num_tokens(832, 480, 33) == 3510 and wan.num_tokens(1280, 704, 121) == 27280
    zimage = ZImageGeometry.of(REAL)
    assert zimage.image_tokens(1024, 1024) == 4096
    assert padded_len(4096 + 1) == 4128 and padded_len(128) == 128
    entry = WanBench()
    count = entry.count_flops(entry.transformer_config(tiny=False), [Segment(3510, 512)])
    # ~2 x 5B params x 3,510 tokens of GEMMs, less the cross-attention K/V weights (0.57B), which
    # see only the 512 text tokens
    assert 2 * 4.3e9 * 3510 < count.gemm < 2 * 4.6e9 * 3510
    assert FlopCount(gemm=780e12, attention=660e12).roofline_s() == pytest.approx(2.0)


@pytest.mark.parametrize("workload_name", ["tiny-wan-cfg", "tiny-zimage-c2"])
def test_gemm_count_equals_torch_flop_counter_on_diffusers_models(workload_name):
    """torch's FlopCounterMode over diffusers' own transformer counts every matmul it runs."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from torch.utils.flop_counter import FlopCounterMode

    entry, workload = step_workloads()[workload_name]
    config = entry.transformer_config(tiny=True)
    model = diffusers_transformer(entry, config, "cpu", torch.float32, 0)
    items = entry.example_items(workload, "cpu", torch.float32, 0)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        if isinstance(entry, WanBench):  # one timestep per item: the minimal work our count assumes
            latents = torch.stack([item["latents"] for item in items])
            texts = torch.stack([item["text"] for item in items])
            model(
                hidden_states=latents, timestep=torch.full((len(items),), 500.0), encoder_hidden_states=texts
            )
        else:
            entry.diffusers_forward(model, items)
    gemm_ops = {"convolution", "addmm", "mm"}  # linear layers and the patch conv; attention apart
    torch_gemm = sum(
        v for op, v in counter.get_flop_counts()["Global"].items() if str(op).split(".")[1] in gemm_ops
    )
    assert entry.count_flops(config, entry.segments(workload)).gemm == torch_gemm
