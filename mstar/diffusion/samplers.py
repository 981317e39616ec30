"""Flow-matching samplers, one instance per request, numerically equal to diffusers' schedulers.

    sampler = UniPCSampler(num_steps=50, shift=5.0)            # Wan2.2 (UniPCMultistepScheduler)
    sampler = UniPCSampler.from_config(UniPCConfig.from_json_file(path), num_steps=20)  # a folder's
    sampler = FlowMatchEulerSampler(num_steps=8, shift=3.0,    # Z-Image-Turbo
                                    sigmas=linear_sigmas(8))
    sampler = FlowMatchEulerSampler(num_steps=4, mu=mu,        # FLUX.2 (mu from the token count)
                                    sigmas=numpy_linear_sigmas(4))
    for t in sampler.timesteps:          # float32 [num_steps], the DiT's timestep input (0..1000 scale)
        velocity = dit(latents, t)
        latents = sampler.step(velocity, latents)   # advances sampler.step_index

`sigmas` is float32 [num_steps + 1] ending in 0. Schedules are computed with the same numpy/torch
operations (and dtypes) as diffusers so that a seed reproduces a diffusers run; the model output is
the flow velocity (noise - data).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from mstar.diffusion.scheduler_config import UniPCConfig

NUM_TRAIN_TIMESTEPS = 1000
KARRAS_RHO = 7.0  # diffusers' (and the EDM paper's) value


def linear_sigmas(num_steps: int) -> list[float]:
    """Z-Image's default schedule before shifting: linspace(1, 1/N, N) in float32."""
    return torch.linspace(1.0, 1 / num_steps, num_steps).tolist()


def numpy_linear_sigmas(num_steps: int) -> list[float]:
    """FLUX.2's default schedule before shifting: np.linspace(1, 1/N, N) in float64 (the scheduler
    rounds it to float32; torch's float32 linspace can differ from that in the last bit)."""
    return np.linspace(1.0, 1 / num_steps, num_steps).tolist()


def native_flow_sigmas(num_steps: int, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS) -> np.ndarray:
    """linspace(1 - 1/N_train, 0, num_steps + 1)[:-1] (float64): the unshifted schedule diffusers'
    Cosmos3 pipeline passes to set_timesteps when its use_native_flow_schedule flag is set."""
    return np.linspace(1.0 - 1.0 / num_train_timesteps, 0.0, num_steps + 1)[:-1]


def karras_flow_sigmas(num_steps: int, sigma_min: float, sigma_max: float) -> np.ndarray:
    """Karras spacing from sigma_max to sigma_min (rho 7) as flow sigmas s / (s + 1), float64 [num_steps]
    (diffusers' UniPC with use_karras_sigmas and use_flow_sigmas; no flow shift)."""
    ramp = np.linspace(0, 1, num_steps)
    min_inv_rho = sigma_min ** (1 / KARRAS_RHO)
    max_inv_rho = sigma_max ** (1 / KARRAS_RHO)
    sigmas = (max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** KARRAS_RHO
    return sigmas / (sigmas + 1)


def exponential_time_shift(mu: float, sigmas: np.ndarray) -> np.ndarray:
    """Resolution-dependent shift used when a scheduler has `use_dynamic_shifting` (sigma = 1)."""
    return math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1) ** 1.0)


def stretch_to_terminal(sigmas: np.ndarray, terminal: float) -> np.ndarray:
    """Scale 1 - sigma so the schedule's last sigma is `terminal` (stretch_shift_to_terminal)."""
    one_minus = 1 - sigmas
    scale = one_minus[-1] / (1 - terminal)
    return 1 - (one_minus / scale)


def _check_num_steps(num_steps: int) -> None:
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")


class FlowMatchEulerSampler:
    """Euler steps on a shifted flow schedule (diffusers FlowMatchEulerDiscreteScheduler).

    `sigmas` (optional, length num_steps) replaces the default linspace(sigma_max, sigma_min)
    schedule; `mu` switches from the static `shift` to the exponential time shift;
    `shift_terminal` stretches the shifted schedule so that it ends at that sigma (LTX's).
    """

    def __init__(
        self,
        num_steps: int,
        shift: float = 1.0,
        sigmas: Sequence[float] | None = None,
        mu: float | None = None,
        num_train_timesteps: int = NUM_TRAIN_TIMESTEPS,
        shift_terminal: float | None = None,
    ):
        _check_num_steps(num_steps)
        if sigmas is not None and len(sigmas) != num_steps:
            raise ValueError(f"got {len(sigmas)} sigmas for {num_steps} steps")
        self.num_steps = num_steps
        self.shift = float(shift)
        self.mu = mu
        self.num_train_timesteps = num_train_timesteps
        self.shift_terminal = shift_terminal
        schedule = self._schedule(sigmas)
        self.timesteps = schedule * num_train_timesteps  # float32 [num_steps]
        self.sigmas = torch.cat([schedule, torch.zeros(1)])  # float32 [num_steps + 1]
        self.step_index = 0

    def _shifted(self, sigmas):
        if self.mu is not None:
            return exponential_time_shift(self.mu, sigmas)
        return self.shift * sigmas / (1 + (self.shift - 1) * sigmas)

    def _schedule(self, sigmas: Sequence[float] | None) -> torch.Tensor:
        if sigmas is None:
            sigma_max, sigma_min = self._train_sigma_range()
            n_train = self.num_train_timesteps
            timesteps = np.linspace(sigma_max * n_train, sigma_min * n_train, self.num_steps)
            schedule = timesteps / n_train
        else:
            schedule = np.array(sigmas).astype(np.float32)
        shifted = np.asarray(self._shifted(schedule))
        if self.shift_terminal:
            shifted = stretch_to_terminal(shifted, self.shift_terminal)
        return torch.from_numpy(shifted).to(torch.float32)

    def _train_sigma_range(self) -> tuple[float, float]:
        """(sigma_max, sigma_min) of the training schedule, shifted unless dynamic (as diffusers)."""
        n_train = self.num_train_timesteps
        train_t = np.linspace(1, n_train, n_train, dtype=np.float32)[::-1].copy()
        train_sigmas = torch.from_numpy(train_t).to(torch.float32) / n_train
        if self.mu is None:
            train_sigmas = self.shift * train_sigmas / (1 + (self.shift - 1) * train_sigmas)
        return train_sigmas[0].item(), train_sigmas[-1].item()

    @property
    def done(self) -> bool:
        return self.step_index >= self.num_steps

    def step(self, model_output: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
        """x_{i+1} = x_i + (sigma_{i+1} - sigma_i) * velocity, in float32."""
        if self.done:
            raise RuntimeError("sampler already took all its steps")
        dt = self.sigmas[self.step_index + 1] - self.sigmas[self.step_index]  # 0-d float32
        prev_sample = sample.to(torch.float32) + dt.item() * model_output.to(torch.float32)
        self.step_index += 1
        return prev_sample


class UniPCSampler:
    """UniPC multistep (predictor B(h) + corrector) on flow sigmas, predicting x0 from the velocity.

    Matches diffusers' UniPCMultistepScheduler with use_flow_sigmas=True,
    prediction_type="flow_prediction", predict_x0=True, final_sigmas_type="zero" and
    timestep_spacing "linspace" (Wan2.2 ships solver_order 2, bh2, flow_shift 5.0 at 720p).
    `karras_sigma_range` (sigma_min, sigma_max) selects use_karras_sigmas: that schedule is used as
    is (no shift, `sigmas` only count the steps, as diffusers does).
    """

    def __init__(
        self,
        num_steps: int,
        shift: float = 1.0,
        solver_order: int = 2,
        solver_type: str = "bh2",
        lower_order_final: bool = True,
        disable_corrector: Sequence[int] = (),
        sigmas: Sequence[float] | None = None,
        mu: float | None = None,
        num_train_timesteps: int = NUM_TRAIN_TIMESTEPS,
        karras_sigma_range: tuple[float, float] | None = None,
    ):
        _check_num_steps(num_steps)
        if solver_type not in ("bh1", "bh2"):
            raise ValueError(f"solver_type must be 'bh1' or 'bh2', got '{solver_type}'")
        self.num_steps = num_steps
        self.shift = float(shift)
        self.solver_order = solver_order
        self.solver_type = solver_type
        self.lower_order_final = lower_order_final
        self.disable_corrector = tuple(disable_corrector)
        self.num_train_timesteps = num_train_timesteps
        self.mu = mu
        self.karras_sigma_range = karras_sigma_range
        schedule = self._schedule(sigmas)  # float64 [num_steps]
        # diffusers casts sigma * 1000 to int64: the DiT sees whole-number timesteps.
        self.timesteps = torch.from_numpy(schedule * num_train_timesteps).to(torch.int64).to(torch.float32)
        self.sigmas = torch.from_numpy(np.concatenate([schedule, [0.0]]).astype(np.float32))
        self.step_index = 0
        self._model_outputs: list[torch.Tensor | None] = [None] * solver_order
        self._lower_order_nums = 0
        self._last_sample: torch.Tensor | None = None
        self._this_order = 1

    @classmethod
    def from_config(
        cls, config: UniPCConfig, num_steps: int, sigmas: Sequence[float] | None = None
    ) -> UniPCSampler:
        """The sampler diffusers' `UniPCMultistepScheduler(**config).set_timesteps(num_steps,
        sigmas=sigmas)` steps through."""
        karras = (config.sigma_min, config.sigma_max) if config.use_karras_sigmas else None
        return cls(
            num_steps,
            shift=config.flow_shift,
            solver_order=config.solver_order,
            solver_type=config.solver_type,
            lower_order_final=config.lower_order_final,
            disable_corrector=config.disable_corrector,
            sigmas=sigmas,
            num_train_timesteps=config.num_train_timesteps,
            karras_sigma_range=karras,  # type: ignore[arg-type]
        )

    def _schedule(self, sigmas: Sequence[float] | None) -> np.ndarray:
        if sigmas is not None and len(sigmas) != self.num_steps:
            raise ValueError(f"got {len(sigmas)} sigmas for {self.num_steps} steps")
        if self.karras_sigma_range is not None:
            return karras_flow_sigmas(self.num_steps, *self.karras_sigma_range)
        if sigmas is None:
            schedule = np.linspace(1, 1 / self.num_train_timesteps, self.num_steps + 1)[:-1]
        else:
            schedule = np.asarray(sigmas)
        if self.mu is not None:
            schedule = exponential_time_shift(self.mu, schedule)
        else:
            schedule = self.shift * schedule / (1 + (self.shift - 1) * schedule)
        schedule = np.array(schedule)
        if np.fabs(schedule[0] - 1) < 1e-6:
            schedule[0] -= 1e-6  # keeps log(sigma) finite at the first step, as diffusers does
        return schedule

    @property
    def done(self) -> bool:
        return self.step_index >= self.num_steps

    def step(self, model_output: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
        """One UniPC step: correct `sample` with the new output, then predict the next sample."""
        if self.done:
            raise RuntimeError("sampler already took all its steps")
        index = self.step_index
        sample = sample.to(torch.float32)
        x0_pred = sample - self.sigmas[index] * model_output  # flow prediction -> data estimate
        use_corrector = (
            index > 0 and (index - 1) not in self.disable_corrector and self._last_sample is not None
        )
        if use_corrector:
            sample = self._correct(x0_pred, self._last_sample, sample, self._this_order)
        self._model_outputs = [*self._model_outputs[1:], x0_pred]
        this_order = self.solver_order
        if self.lower_order_final:
            this_order = min(self.solver_order, self.num_steps - index)
        self._this_order = min(this_order, self._lower_order_nums + 1)  # warm-up of the multistep
        self._last_sample = sample
        prev_sample = self._predict(sample, self._this_order)
        self._lower_order_nums = min(self._lower_order_nums + 1, self.solver_order)
        self.step_index += 1
        return prev_sample

    def _lambda(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(alpha, sigma, log-SNR lambda) at schedule position `index`, 0-d float32."""
        sigma = self.sigmas[index]
        alpha = 1 - sigma
        return alpha, sigma, torch.log(alpha) - torch.log(sigma)

    def _coefficients(self, h: torch.Tensor, rks: torch.Tensor, order: int):
        """(h_phi_1, B_h, R, b) of the UniPC B(h) update (predict_x0: hh = -h)."""
        hh = -h
        h_phi_1 = torch.expm1(hh)
        h_phi_k = h_phi_1 / hh - 1
        b_h = hh if self.solver_type == "bh1" else torch.expm1(hh)
        factorial_i = 1
        rows, b = [], []
        for i in range(1, order + 1):
            rows.append(torch.pow(rks, i - 1))
            b.append(h_phi_k * factorial_i / b_h)
            factorial_i *= i + 1
            h_phi_k = h_phi_k / hh - 1 / factorial_i
        return h_phi_1, b_h, torch.stack(rows), torch.stack(b)

    def _differences(self, newest_index: int, order: int, lambda_s0, h):
        """Ratios rk and scaled output differences D1 of the older outputs against the newest."""
        m0 = self._model_outputs[-1]
        rks, d1s = [], []
        for i in range(1, order):
            _, _, lambda_si = self._lambda(newest_index - i)
            rk = (lambda_si - lambda_s0) / h
            rks.append(rk)
            d1s.append((self._model_outputs[-(i + 1)] - m0) / rk)
        rks.append(torch.ones(()))
        return torch.stack(rks), d1s

    def _predict(self, x: torch.Tensor, order: int) -> torch.Tensor:
        """UniP: x at sigmas[i] -> x at sigmas[i + 1]."""
        index = self.step_index
        alpha_t, sigma_t, lambda_t = self._lambda(index + 1)
        _, sigma_s0, lambda_s0 = self._lambda(index)
        h = lambda_t - lambda_s0
        rks, d1s = self._differences(index, order, lambda_s0, h)
        h_phi_1, b_h, rows, b = self._coefficients(h, rks, order)
        m0 = self._model_outputs[-1]
        x_t = (sigma_t / sigma_s0).item() * x - (alpha_t * h_phi_1).item() * m0
        if d1s:
            rhos_p = [0.5] if order == 2 else torch.linalg.solve(rows[:-1, :-1], b[:-1]).tolist()
            x_t = x_t - (alpha_t * b_h).item() * _weighted_sum(rhos_p, d1s)
        return x_t.to(x.dtype)

    def _correct(self, model_t, last_sample, this_sample, order: int) -> torch.Tensor:
        """UniC: refine the predicted `this_sample` with the output just computed at it."""
        index = self.step_index
        alpha_t, sigma_t, lambda_t = self._lambda(index)
        _, sigma_s0, lambda_s0 = self._lambda(index - 1)
        h = lambda_t - lambda_s0
        rks, d1s = self._differences(index - 1, order, lambda_s0, h)
        h_phi_1, b_h, rows, b = self._coefficients(h, rks, order)
        m0 = self._model_outputs[-1]
        rhos_c = [0.5] if order == 1 else torch.linalg.solve(rows, b).tolist()
        x_t = (sigma_t / sigma_s0).item() * last_sample - (alpha_t * h_phi_1).item() * m0
        correction = rhos_c[-1] * (model_t - m0)
        if d1s:
            correction = _weighted_sum(rhos_c[:-1], d1s) + correction
        return (x_t - (alpha_t * b_h).item() * correction).to(last_sample.dtype)


def _weighted_sum(weights: Sequence[float], tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    total = weights[0] * tensors[0]
    for weight, tensor in zip(weights[1:], tensors[1:], strict=True):
        total = total + weight * tensor
    return total
