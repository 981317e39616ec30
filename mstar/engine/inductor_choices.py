"""Inductor heuristics for the DiT stacks, through inductor's documented InductorChoices hook.

Rows of up to MAX_PERSISTENT_ROW_NUMEL features (Wan 3072, Z-Image 3840) are reduced in one pass
with the row held on chip (a persistent reduction); inductor's own rule stops at 1024 and loops,
reading each row twice. On the H200 the Wan layer-norm kernels went from 7.6 to 6.4 ms per 480p
guidance-pair step. A rule, not a timing, so deterministic mode keeps it. Imported only when a
compile starts (it imports inductor); a module-level class, so inductor can serialise its cache
key by reference.
"""

from __future__ import annotations

from torch._inductor.choices import InductorChoices
from torch._inductor.runtime.hints import ReductionHint
from torch._inductor.virtualized import V

MAX_PERSISTENT_ROW_NUMEL = 4096


class PersistentRowChoices(InductorChoices):
    @staticmethod
    def should_use_persistent_reduction(features, cooperative_reduction) -> bool:
        import torch._inductor.config as inductor_config

        row_wise = features.get_reduction_hint() == ReductionHint.INNER and not cooperative_reduction
        if (
            row_wise
            and inductor_config.triton.persistent_reductions
            and V.graph.sizevars.statically_known_leq(features.reduction_numel, MAX_PERSISTENT_ROW_NUMEL)
        ):
            return True
        return InductorChoices.should_use_persistent_reduction(features, cooperative_reduction)

    def uuid(self) -> str:  # keys inductor's FX graph cache (torch versions that take a factory)
        return f"mstar-persistent-rows-{MAX_PERSISTENT_ROW_NUMEL}"
