"""Inductor heuristics for the DiT stacks, through inductor's documented InductorChoices hook.

Rows of up to MAX_PERSISTENT_ROW_NUMEL features (Wan 3072, Z-Image 3840) are reduced in one pass
with the row held on chip (a persistent reduction); inductor's own rule stops at 1024 and loops,
reading each row twice. On the H200 the Wan layer-norm kernels went from 7.6 to 6.4 ms per 480p
guidance-pair step. The rule asks only that every reduction of the kernel run along contiguous
rows: inductor's kernel-wide hint also wants the fused pointwise work contiguous, and a rotary
epilogue reading the other half of each head is not, so Z-Image's fused q/k norm + rotary looped
(80 us a layer on the H200). A rule, not a timing, so deterministic mode keeps it. Imported only when a
compile starts (it imports inductor); a module-level class, so inductor can serialise its cache
key by reference.
"""

from __future__ import annotations

from torch._inductor.choices import InductorChoices
from torch._inductor.runtime.hints import ReductionHint
from torch._inductor.virtualized import V

MAX_PERSISTENT_ROW_NUMEL = 4096
RULE_VERSION = 2  # part of the cache key: kernels compiled under an earlier rule are not reused


class PersistentRowChoices(InductorChoices):
    @staticmethod
    def should_use_persistent_reduction(features, cooperative_reduction) -> bool:
        import torch._inductor.config as inductor_config

        if (
            not cooperative_reduction
            and _reduces_rows(features)
            and inductor_config.triton.persistent_reductions
            and V.graph.sizevars.statically_known_leq(features.reduction_numel, MAX_PERSISTENT_ROW_NUMEL)
        ):
            return True
        return InductorChoices.should_use_persistent_reduction(features, cooperative_reduction)

    def uuid(self) -> str:  # keys inductor's FX graph cache (torch versions that take a factory)
        return f"mstar-persistent-rows-{RULE_VERSION}-{MAX_PERSISTENT_ROW_NUMEL}"


def _reduces_rows(features) -> bool:
    """Every reduction in the kernel reads contiguous rows (inductor's per-reduction INNER hint)."""
    reductions = features.reduction_nodes() if hasattr(features, "reduction_nodes") else []
    if not reductions or not hasattr(features, "reduction_hint"):
        return features.get_reduction_hint() == ReductionHint.INNER
    return all(features.reduction_hint(node) == ReductionHint.INNER for node in reductions)
