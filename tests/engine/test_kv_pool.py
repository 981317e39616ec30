"""The paged KV pool: layouts, sizing, writes and gathers, and the torch reference attention over
pages against dense causal attention (CPU, float64)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mstar.engine.attention.platform import Libraries, Platform
from mstar.engine.kv.attention import PagedHeads, pad_decode_layout
from mstar.engine.kv.build import build_paged_attention, paged_candidates
from mstar.engine.kv.layout import PagedLayout
from mstar.engine.kv.pool import KVGeometry, KVPool, build_kv_pool, size_pool

HEADS = PagedHeads(
    num_q_heads=4, num_kv_heads=2, head_dim=8, dtype=torch.float64, page_tokens=4, scale=8**-0.5
)


def make_pool(num_pages=16, layers=2):
    return KVPool(KVGeometry(layers, 2, 8, torch.float64, 4), num_pages, "cpu")


def test_layout_page_table_and_slots():
    layout = PagedLayout.build(q_lens=[1, 3], kv_lens=[6, 3], page_ids=[[7, 2], [5]], page_tokens=4)
    assert layout.num_decode == 1 and layout.num_prefill == 1
    assert layout.qo_indptr.tolist() == [0, 1, 4]
    assert layout.kv_page_indptr.tolist() == [0, 2, 3]
    assert layout.kv_page_indices.tolist() == [7, 2, 5]
    assert layout.kv_last_page_lens.tolist() == [2, 3]
    assert layout.new_positions.tolist() == [5, 0, 1, 2]
    assert layout.write_slots.tolist() == [2 * 4 + 1, 20, 21, 22]
    assert layout.gather_slots.tolist() == [28, 29, 30, 31, 8, 9, 20, 21, 22]


def test_layout_rejects_wrong_page_counts_and_misordered_decode_rows():
    with pytest.raises(ValueError, match="need 2 pages"):
        PagedLayout.build([1], [5], [[0]], 4)
    with pytest.raises(ValueError, match="decode segments must come first"):
        PagedLayout.build([2, 1], [2, 1], [[0], [1]], 4, num_decode=2)


def test_decode_padding_uses_the_scratch_page():
    layout = PagedLayout.build([1], [3], [[4]], 4)
    padded = pad_decode_layout(layout, 4, scratch_page=99)
    assert padded.num_segments == 4 and padded.page_ids[1:] == ((99,),) * 3
    assert padded.write_slots.tolist()[1:] == [99 * 4] * 3


def test_write_then_gather_round_trips():
    pool = make_pool()
    slots = torch.tensor([3, 17, 18])
    k, v = torch.randn(3, 2, 8, dtype=torch.float64), torch.randn(3, 2, 8, dtype=torch.float64)
    rows = pool.key_rows(slots)
    pool.write(1, rows, k, v)
    got_k, got_v = pool.gather(1, rows)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
    assert torch.equal(pool.layer(1)[4, 0, 1], k[1])  # slot 17: page 4, offset 1, keys
    assert torch.equal(pool.layer(1)[4, 1, 1], v[1])
    assert pool.layer(0).abs().sum() == 0


def test_one_copy_of_keys_and_values_writes_what_two_do():
    slots = torch.tensor([3, 17, 18])
    k, v = torch.randn(3, 2, 8, dtype=torch.float64), torch.randn(3, 2, 8, dtype=torch.float64)
    two, one = make_pool(), make_pool()
    two.write(1, two.key_rows(slots), k, v)
    kv_rows = one.kv_rows(slots)
    assert kv_rows.tolist() == one.kv_rows(slots.numpy()).tolist()  # host (numpy) and device alike
    one.write_kv(1, kv_rows, k, v)
    assert torch.equal(one.cache, two.cache)


def test_sizing_from_memory_fraction_and_caps():
    geometry = KVGeometry(2, 2, 8, torch.float32, 4)  # 512 bytes a token, 2 KiB a page
    sizing = size_pool(geometry, "cpu", num_pages=None, memory_fraction=0.5, max_useful_pages=10**9,
                       memory_cap_bytes=1 << 20)  # fmt: skip
    assert sizing.num_pages == (1 << 19) // geometry.page_bytes
    assert "0.5 of" in sizing.reason
    capped = size_pool(geometry, "cpu", num_pages=None, memory_fraction=0.5, max_useful_pages=7)
    assert capped.num_pages == 7 and "capped" in capped.reason
    assert size_pool(geometry, "cpu", num_pages=33, memory_fraction=0.5, max_useful_pages=7).num_pages == 33


def test_a_pool_too_small_for_one_request_fails_boot():
    with pytest.raises(ValueError, match="cannot hold one request"):
        build_kv_pool(
            KVGeometry(1, 1, 8, torch.float32, 4), "cpu", num_pages=3, memory_fraction=0.5,
            max_useful_pages=100, min_pages=4,
        )  # fmt: skip


def dense_causal(q, k, v):
    """[L, H, D] x [L, Hkv, D] causal attention, GQA, as the model would run it without a pool."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        is_causal=True, scale=HEADS.scale, enable_gqa=True,
    )  # fmt: skip
    return out[0].transpose(0, 1)


def test_reference_paged_attention_equals_dense_causal_over_chunks_and_decodes():
    """Two sequences: one prefilled in two chunks then decoded, one prefilled whole then decoded;
    every query's output equals dense causal attention over its sequence."""
    torch.manual_seed(0)
    pool = make_pool(num_pages=16, layers=1)
    attention = build_paged_attention(pool, HEADS, "torch")
    lengths = (11, 6)
    q = [torch.randn(n, 4, 8, dtype=torch.float64) for n in lengths]
    k = [torch.randn(n, 2, 8, dtype=torch.float64) for n in lengths]
    v = [torch.randn(n, 2, 8, dtype=torch.float64) for n in lengths]
    pages = [[9, 3, 12], [0, 5]]
    expected = [dense_causal(q[i], k[i], v[i]) for i in range(2)]
    # (seq, start, count) per segment, decode rows first
    steps = [[(0, 0, 4), (1, 0, 5)], [(1, 5, 1), (0, 4, 6)], [(0, 10, 1)]]
    for step in steps:
        layout = PagedLayout.build(
            [n for _, _, n in step], [s + n for _, s, n in step],
            [pages[i][: -(-(s + n) // 4)] for i, s, n in step], 4,
        )  # fmt: skip
        attention.plan(layout)
        out = attention.forward(0, *(torch.cat([t[i][s : s + n] for i, s, n in step]) for t in (q, k, v)))
        offset = 0
        for i, s, n in step:
            torch.testing.assert_close(out[offset : offset + n], expected[i][s : s + n], rtol=0, atol=1e-12)
            offset += n


def test_explicit_backends_that_cannot_run_name_backend_and_device():
    libs = Libraries({"flashinfer": None, "fa3": None})
    with pytest.raises(ValueError, match="'flashinfer' cannot run on cpu: needs a CUDA GPU"):
        paged_candidates("flashinfer", Platform(torch.device("cpu")), libs)
    gpu = Platform(torch.device("cpu"), "NVIDIA H200", (9, 0))  # described as a GPU, library absent
    with pytest.raises(ValueError, match=r"NVIDIA H200 \(sm_90\).*flashinfer-python not installed"):
        paged_candidates("flashinfer", gpu, libs)
    with pytest.raises(ValueError, match="unknown"):
        paged_candidates("paged-magic", gpu, libs)
    assert paged_candidates("auto", gpu, libs) == ["torch"]


def test_boot_check_catches_a_wrong_backend():
    from mstar.engine.kv.backends.torch_paged import TorchPagedBackend, TorchPagedWrapper

    class WrongWrapper(TorchPagedWrapper):
        def run_paged(self, q, pool, layer):
            return super().run_paged(q, pool, layer) * 1.5

    class WrongBackend(TorchPagedBackend):
        def make_wrapper(self, captured, num_rows=None):
            return WrongWrapper(self.device, self.heads)

    from mstar.engine.kv.build import check_paged_backend

    with pytest.raises(ValueError, match="failed its boot check on cpu.*relative error"):
        check_paged_backend(
            WrongBackend(torch.device("cpu"), HEADS), HEADS, Platform(torch.device("cpu")), False
        )


def test_page_table_arrays_are_int32_for_flashinfer():
    layout = PagedLayout.build([2], [2], [[1]], 4)
    for array in (layout.qo_indptr, layout.kv_page_indptr, layout.kv_page_indices, layout.kv_last_page_lens):
        assert array.dtype == np.int32


def test_flashinfer_paged_backend_plans_decode_and_prefill_apart():
    """Through a fake flashinfer (the real signatures, SDPA inside): the decode rows go to the decode
    wrapper and the chunks to the causal prefill wrapper, with the layout's page tables, and the
    answer matches the reference; a captured wrapper takes a padded decode step."""
    from tests.engine.attention_fakes import HOPPER
    from tests.engine.paged_fakes import FakePagedFlashInfer

    fake = FakePagedFlashInfer()
    heads = PagedHeads(4, 2, 8, torch.float32, 4, 8**-0.5)
    pool = KVPool(KVGeometry(1, 2, 8, torch.float32, 4), 16, "cpu")
    pool.cache.normal_()
    workspace = torch.zeros(1024, dtype=torch.uint8)
    attention = build_paged_attention(
        pool, heads, "flashinfer", workspace=workspace, cuda_graphs=True,
        libraries={"flashinfer": fake}, platform=HOPPER,
    )  # fmt: skip
    assert attention.backend_name == "flashinfer" and fake.plans  # the boot check planned and ran
    reference = build_paged_attention(pool, heads, "torch")
    layout = PagedLayout.build([1, 1, 3], [6, 2, 7], [[7, 2], [5], [0, 9]], 4)
    q, k, v = torch.randn(5, 4, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    before = len(fake.plans)
    attention.plan(layout)
    decode_plan, prefill_plan = fake.plans[before:]
    assert decode_plan["indices"] == [7, 2, 5] and decode_plan["last"] == [2, 2]
    assert prefill_plan["qo"] == [0, 3] and prefill_plan["indices"] == [0, 9] and prefill_plan["last"] == [3]
    out = attention.forward(0, q, k, v)
    reference.plan(layout)
    torch.testing.assert_close(out, reference.forward(0, q, k, v), rtol=1e-5, atol=1e-5)
    decode_only = layout.part(0, 2)
    planned = attention.plan(decode_only, graph_rows=4)
    assert planned.num_segments == 4 and fake.plans[-1]["indices"] == [
        7,
        2,
        5,
        pool.scratch_page,
        pool.scratch_page,
    ]


def test_a_layout_as_decode_rows_keeps_slots_positions_and_attention():
    """Each new token becomes a decode row over its sequence up to itself: the same pack order,
    write slots and positions, and the same causal attention (torch reference, float64)."""
    torch.manual_seed(0)
    layout = PagedLayout.build([1, 3, 5], [6, 7, 5], [[7, 2], [0, 9], [4, 11]], 4)
    rows = layout.as_decode_rows()
    assert rows.num_decode == rows.num_segments == 9 and rows.num_prefill == 0
    assert rows.kv_lens == (6, 5, 6, 7, 1, 2, 3, 4, 5)
    assert rows.page_ids[1:4] == ((0, 9),) * 3 and rows.page_ids[4:8] == ((4,),) * 4
    assert rows.write_slots.tolist() == layout.write_slots.tolist()
    assert rows.new_positions.tolist() == layout.new_positions.tolist()
    assert rows.num_page_indices == 2 + 3 * 2 + 4 * 1 + 2
    assert layout.part(0, 1).as_decode_rows() == layout.part(0, 1)  # decode rows stay as they are
    pool = make_pool(num_pages=16, layers=1)
    pool.cache.normal_()
    q, k, v = torch.randn(9, 4, 8, dtype=torch.float64), *torch.randn(2, 9, 2, 8, dtype=torch.float64)
    outputs = []
    for planned in (layout, rows):
        attention = build_paged_attention(pool, HEADS, "torch")
        attention.plan(planned)
        outputs.append(attention.forward(0, q, k, v))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="causal"):
        PagedLayout.build([2], [2], [[1]], 4, causal=False).as_decode_rows()


def test_the_arrays_as_decode_rows_carries_are_what_its_rows_build():
    """as_decode_rows hands its rows their page table, slots and positions ready made (from the
    segments' own): the same arrays a layout built from the rows' lengths and pages computes."""
    pages = tuple(range(20, 46))
    layout = PagedLayout.build(
        [1, 1, 5, 7, 4], [9, 4, 103, 7, 13], [[3, 4, 5], [8], pages[:26], [60, 61], [1, 2, 9, 10]], 4
    )
    rows = layout.as_decode_rows()
    fresh = PagedLayout.build([1] * rows.num_segments, rows.kv_lens, rows.page_ids, 4)
    assert fresh == rows and fresh.num_decode == rows.num_decode == 18
    for name in (
        "kv_page_indices",
        "kv_page_indptr",
        "kv_last_page_lens",
        "qo_indptr",
        "write_slots",
        "new_positions",
    ):
        carried, built = getattr(rows, name), getattr(fresh, name)
        assert carried.dtype == built.dtype and carried.tolist() == built.tolist(), name
    padded = pad_decode_layout(rows, rows.num_segments + 3, scratch_page=99)
    fresh = PagedLayout.build([1] * 21, rows.kv_lens + (1,) * 3, rows.page_ids + ((99,),) * 3, 4)
    assert fresh == padded and padded.num_decode == 21
    for name in ("kv_page_indices", "kv_page_indptr", "kv_last_page_lens", "write_slots", "new_positions"):
        carried, built = getattr(padded, name), getattr(fresh, name)
        assert carried.dtype == built.dtype and carried.tolist() == built.tolist(), name
    assert layout.new_positions.tolist() == [8, 3, 98, 99, 100, 101, 102, 0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12]
    assert layout.qo_indptr.tolist() == [0, 1, 2, 7, 14, 18] and layout.qo_indptr.dtype == np.int32


def test_page_tables_built_at_once_equal_the_rows_pages():
    """as_decode_rows and pad_decode_layout give their flat page table ready made: the same entries
    as every row's pages in order; the whole range of a layout is the layout itself."""
    pages = tuple(range(20, 46))
    layout = PagedLayout.build([1, 5, 7], [9, 103, 7], [[3, 4, 5], pages[:26], [60, 61]], 4)
    rows = layout.as_decode_rows()
    flat = [page for ids in rows.page_ids for page in ids]
    assert rows.kv_page_indices.dtype == np.int32 and rows.kv_page_indices.tolist() == flat
    padded = pad_decode_layout(rows, rows.num_segments + 3, scratch_page=99)
    assert padded.kv_page_indices.tolist() == flat + [99] * 3
    assert padded.write_slots.tolist()[: rows.num_segments] == layout.write_slots.tolist()
    assert pad_decode_layout(rows, rows.num_segments, scratch_page=99) is rows
    assert layout.part(0, 3) is layout and layout.part(0, 2) == PagedLayout.build(
        [1, 5], [9, 103], [[3, 4, 5], pages[:26]], 4, 1
    )
