"""Train the tiny digits model on one CPU core: `python -m mstar.models.tiny_digits.train`.

Rectified flow on scikit-learn's digits (upscaled to 16x16 pixels), text-conditioned through a word
encoder, with 10% of prompts dropped to "" so classifier-free guidance works. The DiT is the Wan DiT
(mstar.models.wan22.dit) at a toy size, called exactly as serving calls it: a list of items packed
into one forward. Seeded; writes weights/*.safetensors, weights/config.json, weights/vocab.json and
the model card README.md (loss curve, accuracy of the generated digits by a held-out classifier).
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from mstar.engine.attention import AttentionLayout, reference_attention
from mstar.models.tiny_digits import data, flow
from mstar.models.tiny_digits.config import (
    CONFIG_FILE,
    DIT_FILE,
    TEXT_ENCODER_FILE,
    VOCAB_FILE,
    WEIGHTS_DIR,
    TinyDigitsConfig,
)
from mstar.models.tiny_digits.text import WordTokenizer, build_vocab, make_text_encoder, pad_token_ids
from mstar.models.wan22.config import WanDiTConfig
from mstar.models.wan22.dit import DiTInput, WanDiT

LABEL_DROPOUT = 0.1
WARMUP_STEPS = 100
EMA_DECAY = 0.999
GRAD_CLIP = 1.0


@dataclass
class TrainSettings:
    num_steps: int = 2000
    batch_size: int = 64
    learning_rate: float = 1e-3
    seed: int = 0
    log_every: int = 100


@dataclass
class TrainResult:
    loss_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, mean loss since last log)
    train_time_s: float = 0.0


class TrainingAttention:
    """Attention behind the plan/run interface for training: plain autograd-friendly torch.

    Training items all have the same token count, so each label runs as ONE masked SDPA over
    [items, heads, tokens, head_dim] (keys padded to the longest text); the result equals the
    engine's reference attention (SDPA per segment), which it falls back to for ragged queries.
    """

    def __init__(self) -> None:
        self.layouts: dict[str, AttentionLayout] = {}
        self.padded: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def plan(self, label: str, layout: AttentionLayout) -> None:
        self.layouts[label] = layout
        self.padded.pop(label, None)
        if len(set(layout.q_lens)) == 1:
            self.padded[label] = _padded_key_index(layout)

    def run(self, label: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        layout = self.layouts[label]
        if label not in self.padded:
            return reference_attention(q, k, v, layout)
        key_index, key_mask = self.padded[label]  # [B * Lmax] int64, [B, 1, 1, Lmax] bool
        num_items, num_heads = layout.num_segments, q.shape[1]

        def batched(x: torch.Tensor) -> torch.Tensor:  # [B * S, H, D] -> [B, H, S, D]
            return x.unflatten(0, (num_items, -1)).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            batched(q), batched(k[key_index]), batched(v[key_index]), attn_mask=key_mask
        )  # [B, H, Sq, D]
        return out.transpose(1, 2).reshape(-1, num_heads, q.shape[-1])


def _padded_key_index(layout: AttentionLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather index of every segment's keys padded to the longest, and the mask of real keys."""
    max_len = layout.max_kv_len
    starts = torch.tensor(layout.cu_seqlens_kv()[:-1]).unsqueeze(1)  # [B, 1]
    lens = torch.tensor(layout.kv_lens).unsqueeze(1)
    positions = torch.arange(max_len).unsqueeze(0)  # [1, Lmax]
    valid = positions < lens  # [B, Lmax]
    index = torch.where(valid, starts + positions, starts)
    return index.flatten(), valid[:, None, None, :]


class Trainer:
    def __init__(self, config: TinyDigitsConfig, settings: TrainSettings):
        torch.manual_seed(settings.seed)
        self.config = config
        self.settings = settings
        self.tokenizer = WordTokenizer(build_vocab(), config.max_text_tokens)
        self.dit = WanDiT(WanDiTConfig.from_dict(config.dit))
        self.text_encoder = make_text_encoder(len(self.tokenizer.vocab), config.text_dim)
        self.params = [*self.dit.parameters(), *self.text_encoder.parameters()]
        self.optimizer = torch.optim.AdamW(self.params, lr=settings.learning_rate, weight_decay=0.0)
        self.ema_dit = copy.deepcopy(self.dit).requires_grad_(False)
        self.ema_text_encoder = copy.deepcopy(self.text_encoder).requires_grad_(False)
        self.generator = torch.Generator().manual_seed(settings.seed)
        self.attention = TrainingAttention()

    def encode(self, encoder, prompts: list[str]) -> list[torch.Tensor]:
        """Prompts -> one [L_i, text_dim] tensor each (padding dropped, as serving encodes one by one)."""
        token_lists = [self.tokenizer.encode(p) for p in prompts]
        ids, padding_mask = pad_token_ids(token_lists)
        hidden = encoder(ids, padding_mask)  # [B, L, text_dim]
        return [hidden[row, : len(tokens)] for row, tokens in enumerate(token_lists)]

    def batch_prompts(self, labels: torch.Tensor) -> list[str]:
        num_items = len(labels)
        templates = torch.randint(len(data.PROMPT_TEMPLATES), (num_items,), generator=self.generator)
        dropped = torch.rand(num_items, generator=self.generator) < LABEL_DROPOUT
        return [
            "" if dropped[i] else data.prompt_for(int(labels[i]), int(templates[i])) for i in range(num_items)
        ]

    def learning_rate(self, step: int) -> float:
        """Linear warm-up then cosine decay to 10% of the peak."""
        warmup = min(1.0, (step + 1) / WARMUP_STEPS)
        cosine = 0.5 * (1 + math.cos(math.pi * step / self.settings.num_steps))
        return self.settings.learning_rate * warmup * (0.1 + 0.9 * cosine)

    def train_step(self, images: torch.Tensor, labels: torch.Tensor, step: int) -> float:
        index = torch.randint(len(labels), (self.settings.batch_size,), generator=self.generator)
        x0 = images[index]  # [B, 1, 1, S, S]
        x_sigma, timesteps, target = flow.noisy_sample(x0, self.generator, self.config.sampler_shift)
        texts = self.encode(self.text_encoder, self.batch_prompts(labels[index]))
        items = [DiTInput(x_sigma[i], float(timesteps[i]), texts[i]) for i in range(len(index))]
        velocity = torch.stack(self.dit(items, self.attention))  # [B, 1, 1, S, S]
        loss = (velocity - target).pow(2).mean()
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(step)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, GRAD_CLIP)
        self.optimizer.step()
        self.update_ema(step)
        return loss.item()

    @torch.no_grad()
    def update_ema(self, step: int) -> None:
        # Short effective horizon early on (the average of few steps), EMA_DECAY later.
        decay = min(EMA_DECAY, (1 + step) / (10 + step))
        ema_params = [*self.ema_dit.parameters(), *self.ema_text_encoder.parameters()]
        for ema_param, param in zip(ema_params, self.params, strict=True):
            ema_param.lerp_(param, 1 - decay)

    def fit(self, images: torch.Tensor, labels: torch.Tensor) -> TrainResult:
        result = TrainResult()
        start_s = time.monotonic()
        window: list[float] = []
        for step in range(self.settings.num_steps):
            window.append(self.train_step(images, labels, step))
            if (step + 1) % self.settings.log_every == 0 or step + 1 == self.settings.num_steps:
                mean_loss = sum(window) / len(window)
                result.loss_curve.append((step + 1, mean_loss))
                window = []
                elapsed_s = time.monotonic() - start_s
                print(
                    f"step {step + 1}/{self.settings.num_steps} loss {mean_loss:.4f} ({elapsed_s:.0f} s)",
                    flush=True,
                )
        result.train_time_s = time.monotonic() - start_s
        return result

    def save(self, weights_dir: Path) -> None:
        from safetensors.torch import save_file

        weights_dir.mkdir(parents=True, exist_ok=True)
        save_file(_contiguous(self.ema_dit.state_dict()), str(weights_dir / DIT_FILE))
        save_file(_contiguous(self.ema_text_encoder.state_dict()), str(weights_dir / TEXT_ENCODER_FILE))
        self.tokenizer.save(weights_dir / VOCAB_FILE)
        self.config.save(weights_dir / CONFIG_FILE)


def _contiguous(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().contiguous() for name, tensor in state.items()}


def parse_args(argv: list[str] | None) -> tuple[TrainSettings, Path]:
    defaults = TrainSettings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=defaults.num_steps)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--weights-dir", type=Path, default=WEIGHTS_DIR)
    args = parser.parse_args(argv)
    settings = TrainSettings(args.steps, args.batch_size, args.learning_rate, args.seed)
    return settings, args.weights_dir


def main(argv: list[str] | None = None) -> int:
    from mstar.models.tiny_digits.model_card import evaluate_and_write_card

    torch.set_num_threads(1)  # the machine is shared; the model is sized for one core
    settings, weights_dir = parse_args(argv)
    config = TinyDigitsConfig()
    train_split, _ = data.load_splits()
    images = data.upscale_to_model(train_split.images_8px, config.image_size)
    labels = torch.from_numpy(train_split.labels)
    trainer = Trainer(config, settings)
    result = trainer.fit(images, labels)
    trainer.save(weights_dir)
    evaluate_and_write_card(weights_dir, settings, result, num_train_images=len(labels))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
