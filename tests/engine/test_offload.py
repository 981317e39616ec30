"""StreamedBlocks on a tiny UMT5 encoder: same output as unwrapped, host storage between forwards."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mstar.engine.offload import StreamedBlocks, _pack
from mstar.models.wan22.config import tiny_wan22_config

transformers = pytest.importorskip("transformers")


def tiny_umt5(**overrides) -> nn.Module:
    """The tiny Wan config's UMT5 with three blocks (streaming needs more blocks than slots)."""
    config = dict(tiny_wan22_config().text_encoder, vocab_size=64, num_layers=3) | overrides
    torch.manual_seed(0)
    return transformers.UMT5EncoderModel(transformers.UMT5Config(**config)).eval()


def input_ids(device: str = "cpu") -> torch.Tensor:
    return torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1)).to(device)


def encode(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state


def block_tensors(block: nn.Module) -> list[torch.Tensor]:
    return [*block.parameters(), *block.buffers()]


def test_output_bit_identical_and_host_storage_between_forwards():
    model, ids = tiny_umt5(), input_ids()
    reference = encode(model, ids)
    weights = [[tensor.clone() for tensor in block_tensors(block)] for block in model.encoder.block]
    streamed = StreamedBlocks(model.encoder.block, device="cpu")
    slot_ptrs = [[tensor.data_ptr() for tensor in slot] for slot in streamed._slots]
    for _ in range(2):
        assert torch.equal(encode(model, ids), reference)
        with torch.inference_mode():
            assert torch.equal(model(input_ids=ids).last_hidden_state, reference)
        for block, host, expected in zip(model.encoder.block, streamed._host, weights, strict=True):
            assert [t.data_ptr() for t in block_tensors(block)] == [h.data_ptr() for h in host]
            assert all(torch.equal(h, e) for h, e in zip(host, expected, strict=True))
        assert [[tensor.data_ptr() for tensor in slot] for slot in streamed._slots] == slot_ptrs
    assert streamed.slot_bytes * 3 == streamed.host_bytes * 2  # 2 slots of 3 equal blocks


def test_blocks_run_on_their_slot_and_each_block_is_copied_once(monkeypatch):
    model, ids = tiny_umt5(), input_ids()
    streamed = StreamedBlocks(model.encoder.block, device="cpu", num_slots=2)
    copies, ptrs_in_forward = [], []
    original_queue_copy = streamed._queue_copy
    monkeypatch.setattr(
        streamed, "_queue_copy", lambda index, slot: (copies.append(index), original_queue_copy(index, slot))
    )
    for block in model.encoder.block:  # registered after ours, so it sees the block in its slot
        block.register_forward_pre_hook(
            lambda b, args: ptrs_in_forward.append(next(b.parameters()).data_ptr())
        )
    encode(model, ids)
    encode(model, ids)
    assert copies == [0, 1, 2] * 2
    slot_first_ptr = [slot[0].data_ptr() for slot in streamed._slots]
    assert ptrs_in_forward == [slot_first_ptr[index % 2] for index in range(3)] * 2


@pytest.mark.parametrize("num_slots", [1, 3])
def test_num_slots_same_output(num_slots):
    model, ids = tiny_umt5(), input_ids()
    reference = encode(model, ids)
    StreamedBlocks(model.encoder.block, device="cpu", num_slots=num_slots)
    assert torch.equal(encode(model, ids), reference)
    assert torch.equal(encode(model, ids), reference)


def test_built_under_inference_mode_runs_outside_it():
    model, ids = tiny_umt5(), input_ids()
    reference = encode(model, ids)
    with torch.inference_mode():
        streamed = StreamedBlocks(model.encoder.block, device="cpu")
    assert not any(tensor.is_inference() for slot in streamed._slots for tensor in slot)
    assert torch.equal(encode(model, ids), reference)


def test_mismatching_blocks_and_bad_num_slots_raise():
    blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 5)])
    with pytest.raises(ValueError, match="block 2 .*'weight'"):
        StreamedBlocks(blocks, device="cpu")
    extra = nn.ModuleList([nn.Linear(4, 4), nn.Sequential()])
    with pytest.raises(ValueError, match="'weight'"):
        StreamedBlocks(extra, device="cpu")
    with pytest.raises(ValueError, match="num_slots"):
        StreamedBlocks(nn.ModuleList([nn.Linear(4, 4)]), device="cpu", num_slots=0)


def test_forward_raising_midway_leaves_next_forward_correct(monkeypatch):
    model, ids = tiny_umt5(), input_ids()
    reference = encode(model, ids)
    streamed = StreamedBlocks(model.encoder.block, device="cpu")
    feed_forward = model.encoder.block[1].layer[-1]
    original_forward, calls = feed_forward.forward, []

    def raise_once(hidden_states):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return original_forward(hidden_states)

    monkeypatch.setattr(feed_forward, "forward", raise_once)
    with pytest.raises(RuntimeError, match="boom"):
        encode(model, ids)
    for block, host in zip(model.encoder.block, streamed._host, strict=True):  # always_call hooks
        assert [t.data_ptr() for t in block_tensors(block)] == [h.data_ptr() for h in host]
    assert torch.equal(encode(model, ids), reference)


def test_remove_removes_hooks():
    model = tiny_umt5()
    streamed = StreamedBlocks(model.encoder.block, device="cpu")
    streamed.remove()
    for block in model.encoder.block:
        assert not block._forward_pre_hooks and not block._forward_hooks
    assert streamed.slot_bytes == 0


def test_pack_umt5_xxl_block_sizes_wastes_little_and_never_overlaps():
    mib = 1 << 20
    one_block = [32 * mib] * 4 + [80 * mib] * 3 + [4096, 8192, 8192]  # q k v o, wi_0 wi_1 wo, bias, norms
    sizes = one_block * 24 + [300 * mib, 0, 3]  # an oversized tensor gets a chunk of its own
    used_bytes, places = _pack(sizes, chunk_bytes=256 * mib)
    assert len(used_bytes) * 256 * mib <= 1.06 * sum(sizes)
    assert used_bytes[places[-3][0]] == 300 * mib
    for chunk in range(len(used_bytes)):
        spans = sorted(
            (offset, offset + size) for size, (c, offset) in zip(sizes, places, strict=True) if c == chunk
        )
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False))
        assert all(start % 512 == 0 for start, _ in spans) and spans[-1][1] <= used_bytes[chunk]


@pytest.mark.gpu
def test_cuda_bf16_same_output_and_less_memory():
    model = tiny_umt5(d_model=256, d_kv=64, d_ff=1024, num_layers=4, vocab_size=64)
    model = model.to("cuda", torch.bfloat16)
    ids = input_ids("cuda")
    reference = encode(model, ids)
    torch.cuda.synchronize()
    unwrapped_bytes = torch.cuda.memory_allocated()
    streamed = StreamedBlocks(model.encoder.block, device="cuda")
    saved_bytes = unwrapped_bytes - torch.cuda.memory_allocated()
    assert saved_bytes >= streamed.host_bytes - streamed.slot_bytes
    assert all(t.is_pinned() for host in streamed._host for t in host)
    for _ in range(2):
        assert torch.equal(encode(model, ids), reference)
        with torch.inference_mode():
            assert torch.equal(model(input_ids=ids).last_hidden_state, reference)
    torch.cuda.synchronize()
