"""A diffusers UniPCMultistepScheduler config (scheduler/scheduler_config.json) as a typed value.

No torch here (model configs read it in the API process). Every UniPC family reads its folder
through this one type (Wan2.2, Cosmos3). `UniPCSampler.from_config` turns it into
a per-request sampler; settings our sampler does not implement are refused when the file is read,
naming the key, so a checkpoint never runs on a silently different schedule.

    config = UniPCConfig.from_json_file("ckpt/scheduler/scheduler_config.json")
    config = config.with_flow_shift(12.0)      # a serving recipe's shift (flow sigmas, no Karras)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

# Keys that do not change a flow-sigma schedule: the beta schedule only exists for noise-prediction
# models, timestep_spacing and steps_offset only for non-flow timesteps.
_IRRELEVANT_KEYS = {
    "beta_start",
    "beta_end",
    "beta_schedule",
    "trained_betas",
    "timestep_spacing",
    "steps_offset",
    "rescale_betas_zero_snr",
    "dynamic_thresholding_ratio",
    "sample_max_value",
    "time_shift_type",
}
# Keys whose non-default values our sampler does not implement, with the value it needs.
_REQUIRED_VALUES: dict[str, Any] = {
    "prediction_type": "flow_prediction",
    "predict_x0": True,
    "use_flow_sigmas": True,
    "final_sigmas_type": "zero",
    "thresholding": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "use_dynamic_shifting": False,
    "shift_terminal": None,
    "solver_p": None,
}


@dataclasses.dataclass(frozen=True)
class UniPCConfig:
    """The UniPC settings that shape a flow-matching schedule; defaults are diffusers'."""

    num_train_timesteps: int = 1000
    solver_order: int = 2
    solver_type: str = "bh2"
    lower_order_final: bool = True
    disable_corrector: tuple[int, ...] = ()
    flow_shift: float = 1.0
    # Karras spacing between sigma_max and sigma_min, mapped to flow sigmas s / (1 + s); diffusers
    # then ignores flow_shift.
    use_karras_sigmas: bool = False
    sigma_min: float | None = None
    sigma_max: float | None = None

    def __post_init__(self) -> None:
        if self.solver_type not in ("bh1", "bh2"):
            raise ValueError(f"UniPC solver_type must be 'bh1' or 'bh2', got {self.solver_type!r}")
        if self.solver_order < 1:
            raise ValueError(f"UniPC solver_order must be >= 1, got {self.solver_order}")
        if self.use_karras_sigmas and (self.sigma_min is None or self.sigma_max is None):
            raise ValueError("UniPC use_karras_sigmas needs sigma_min and sigma_max in the config")

    def with_flow_shift(self, flow_shift: float) -> UniPCConfig:
        """The schedule with `flow_shift` applied to flow sigmas, as the published recipes set it
        (`UniPCMultistepScheduler.from_config(config, flow_shift=..., use_karras_sigmas=False)`)."""
        return dataclasses.replace(self, flow_shift=float(flow_shift), use_karras_sigmas=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> UniPCConfig:
        """From a scheduler_config.json dict; `_`-prefixed metadata is skipped, but a file of another
        scheduler class is refused."""
        name = raw.get("_class_name", "UniPCMultistepScheduler")
        if name != "UniPCMultistepScheduler":
            raise ValueError(f"scheduler config: {name} is not supported (UniPCMultistepScheduler is)")
        fields = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key.startswith("_") or key in _IRRELEVANT_KEYS:
                continue
            if key in _REQUIRED_VALUES:
                if value != _REQUIRED_VALUES[key]:
                    raise ValueError(
                        f"UniPC scheduler config: {key}={value!r} is not supported "
                        f"(needs {_REQUIRED_VALUES[key]!r})"
                    )
                continue
            if key not in fields:
                raise ValueError(f"UniPC scheduler config: unknown key '{key}'")
            values[key] = tuple(value) if isinstance(value, list) else value
        if "prediction_type" not in raw or "use_flow_sigmas" not in raw:
            raise ValueError(
                "UniPC scheduler config: needs prediction_type and use_flow_sigmas (flow matching)"
            )
        return cls(**values)

    @classmethod
    def from_json_file(cls, path: str | Path) -> UniPCConfig:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))
