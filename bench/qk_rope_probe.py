"""Z-Image's attention prologue alone (q/k RMS norm over head_dim, then rotary), compiled as the DiT
compiles it, in a few formulations: where its 136 us per layer (a looped reduction kernel, ~4x its
memory time at 1024x1024) could go. A diagnostic for the H200; prints ms per call.

    python3 bench/qk_rope_probe.py
"""

from __future__ import annotations

import torch

from mstar.engine import inductor_choices
from mstar.engine.compile import CompiledFunction
from mstar.models.zimage.dit_layers import RMSNorm, apply_rotary

NUM_TOKENS, NUM_HEADS, HEAD_DIM = 4224, 30, 128  # 1024x1024: 4096 image tokens + a padded caption


def rotary_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary with each head's real parts first and imaginary parts second (q/k weight rows
    permuted at load would give this layout; attention scores do not change)."""
    real, imag = x.float().chunk(2, dim=-1)  # [T, H, D/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([real * cos - imag * sin, real * sin + imag * cos], dim=-1).type_as(x)


def prologue(rotary):
    norm_q = RMSNorm(HEAD_DIM, 1e-5).cuda().bfloat16()
    norm_k = RMSNorm(HEAD_DIM, 1e-5).cuda().bfloat16()

    def run(qkv, cos, sin):
        q, k, v = qkv.unflatten(-1, (3, NUM_HEADS, -1)).unbind(-3)  # [T, H, D] each
        return rotary(norm_q(q), cos, sin), rotary(norm_k(k), cos, sin), v

    return run


def time_ms(fn, *args, num_calls: int = 50) -> float:
    for _ in range(5):
        fn(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(num_calls):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / num_calls


def any_hint_rows(features, cooperative_reduction) -> bool:
    """Persistent for rows up to 256 whatever inductor's reduction hint says."""
    from torch._inductor.virtualized import V

    if not cooperative_reduction and V.graph.sizevars.statically_known_leq(features.reduction_numel, 256):
        return True
    return original_rule(features, cooperative_reduction)


original_rule = inductor_choices.PersistentRowChoices.should_use_persistent_reduction


def main() -> None:
    torch.manual_seed(0)
    qkv = torch.randn(NUM_TOKENS, 3 * NUM_HEADS * HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    cos, sin = (torch.randn(NUM_TOKENS, HEAD_DIM // 2, device="cuda") for _ in range(2))
    moved_bytes = 2 * (2 * NUM_TOKENS * NUM_HEADS * HEAD_DIM * 2)  # q and k read and written, bf16
    variants = [
        ("pairs (as served)", apply_rotary, original_rule),
        ("pairs, persistent rows of any hint", apply_rotary, any_hint_rows),
        ("halves", rotary_halves, original_rule),
        ("halves, persistent rows of any hint", rotary_halves, any_hint_rows),
    ]
    for name, rotary, rule in variants:
        torch._dynamo.reset()
        inductor_choices.PersistentRowChoices.should_use_persistent_reduction = staticmethod(rule)
        compiled = CompiledFunction(
            prologue(rotary),
            "deterministic",
            name,
            persistent_rows=True,
            extra_options={"fx_graph_cache": False},
        )
        ms = time_ms(compiled, qkv, cos, sin)
        print(f"{name}: {ms * 1000:.1f} us per call, {moved_bytes / ms / 1e9:.2f} TB/s of q/k traffic")


if __name__ == "__main__":
    main()
