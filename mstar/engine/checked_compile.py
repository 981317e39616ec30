"""A compiled path checked against its eager reference before it serves, per input shape.

    decode = CheckedCompile(compiled_decode, eager_decode, "zimage vae", key=lambda z: tuple(z.shape))
    frames = decode(latents)        # first call of a shape: both run, compared; then the winner serves

The first call of each key (an input shape) runs the compiled function and the eager reference and
compares their outputs (`uint8_psnr_db` by default, higher is closer). At or above `min_score` the
compiled output is served and the key serves compiled from then on; below it (a miscompile) the
reference output is served and the key serves eagerly from then on, with a warning, so wrong output
never reaches a client. `check_first_call=False` serves unchecked keys compiled without running the
reference (for outputs that leave in pieces while they are made): `check(...)` checks a key ahead
(at warmup). `parts` are the CompiledFunctions behind the compiled path (warmup and recompiles).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable
from typing import Any

logger = logging.getLogger(__name__)

MIN_PSNR_DB = 40.0  # compiled vs eager uint8 frames: bf16 kernel differences stay far above this


def uint8_psnr_db(frames: Any, reference: Any) -> float:
    """PSNR of uint8 frames against reference frames of the same shape (inf when equal)."""
    mse = (frames.float() - reference.float()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


class CheckedCompile:
    def __init__(
        self,
        compiled: Callable[..., Any],
        eager: Callable[..., Any],
        name: str,
        key: Callable[..., Hashable],
        compare: Callable[[Any, Any], float] = uint8_psnr_db,
        min_score: float = MIN_PSNR_DB,
        parts: list[Any] | tuple[Any, ...] = (),
        check_first_call: bool = True,
    ):
        self.compiled = compiled
        self.eager = eager
        self.name = name
        self.key = key
        self.compare = compare
        self.min_score = min_score
        self.parts = list(parts)
        self.check_first_call = check_first_call
        self.scores: dict[Hashable, float] = {}  # key -> compiled vs eager score
        self.eager_keys: set[Hashable] = set()  # keys whose compiled output was wrong

    def serves_compiled(self, *args: Any) -> bool:
        return self.key(*args) not in self.eager_keys

    def __call__(self, *args: Any) -> Any:
        key = self.key(*args)
        if key in self.eager_keys:
            return self.eager(*args)
        if key in self.scores or not self.check_first_call:
            return self.compiled(*args)
        return self._checked(key, args)[1]

    def check(self, *args: Any) -> float:
        """Check the key of `args` now (warmup); returns its score."""
        key = self.key(*args)
        if key not in self.scores:
            self._checked(key, args)
        return self.scores[key]

    def _checked(self, key: Hashable, args: tuple) -> tuple[float, Any]:
        output = self.compiled(*args)
        reference = self.eager(*args)
        score = self.scores[key] = self.compare(output, reference)
        if score >= self.min_score:
            logger.info("%s: compiled output at %s matches eager (%.1f)", self.name, key, score)
            return score, output
        logger.warning(
            "%s: compiled output at %s disagrees with eager (%.1f < %.1f); serving it eagerly from now on",
            self.name, key, score, self.min_score,
        )  # fmt: skip
        self.eager_keys.add(key)
        return score, reference

    def finish_warmup(self) -> None:
        """After the warmup shapes: a compile from now on (a new shape) is a recompile."""
        for part in self.parts:
            part.finish_warmup()

    @property
    def num_recompiles(self) -> int:
        return sum(part.num_recompiles for part in self.parts)
