"""Train tiny-chat on one CPU core: `python -m mstar.models.tiny_chat.train`.

A Qwen3-shaped model (mstar.models.qwen3: the module serving runs) learns generated arithmetic
chats: the user asks a two- or three-digit sum or difference, the assistant answers "a op b = c".
Fresh problems every step (seeded), loss on the assistant's tokens only, AdamW with warm-up and
cosine decay. Writes weights/ in transformers' Qwen3 layout (config.json, model.safetensors,
generation_config.json, the tokenizer with its chat template); the model card measures it through
the server (`python -m mstar.models.tiny_chat.model_card`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from mstar.models.qwen3.config import Qwen3Config
from mstar.models.qwen3.transformer import DenseCausalAttention, Qwen3ForCausalLM
from mstar.models.tiny_chat.data import random_problem
from mstar.models.tiny_chat.tokenizer import END_OF_TEXT, IM_END, build_tokenizer, save_tokenizer

WEIGHTS_DIR = Path(__file__).parent / "weights"
SEQUENCE_TOKENS = 40  # the longest rendered problem is 36 tokens
CONTEXT_TOKENS = 256
WARMUP_STEPS = 200
GRAD_CLIP = 1.0


def tiny_chat_config(vocab_size: int, eos_id: int, bos_id: int) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=10_000.0,
        max_position_embeddings=CONTEXT_TOKENS,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )


@dataclass
class TrainSettings:
    num_steps: int = 2500
    batch_size: int = 64
    learning_rate: float = 3e-3
    weight_decay: float = 0.05
    seed: int = 0
    log_every: int = 250


@dataclass
class TrainResult:
    loss_curve: list[tuple[int, float]] = field(default_factory=list)
    train_time_s: float = 0.0


class Batches:
    """Rendered problems as fixed-length rows: ids [B, L] and the loss mask [B, L] (assistant part)."""

    def __init__(self, tokenizer, seed: int):
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self.pad_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)

    def row(self) -> tuple[list[int], list[bool]]:
        problem = random_problem(self.rng)
        prompt = self.tokenizer.apply_chat_template(
            problem.messages(), tokenize=False, add_generation_prompt=True
        )
        prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        reply_ids = self.tokenizer.encode(problem.reply() + IM_END, add_special_tokens=False)
        ids = (prompt_ids + reply_ids)[:SEQUENCE_TOKENS]
        mask = ([False] * len(prompt_ids) + [True] * len(reply_ids))[:SEQUENCE_TOKENS]
        padding = SEQUENCE_TOKENS - len(ids)
        return ids + [self.pad_id] * padding, mask + [False] * padding

    def next(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows cut to the batch's longest problem (padding costs compute on a CPU)."""
        rows = [self.row() for _ in range(batch_size)]
        length = max(len(mask) - mask[::-1].index(True) for _, mask in rows)
        return torch.tensor([r[0][:length] for r in rows]), torch.tensor([r[1][:length] for r in rows])


class Trainer:
    def __init__(self, settings: TrainSettings):
        torch.manual_seed(settings.seed)
        self.settings = settings
        self.tokenizer = build_tokenizer()
        eos = self.tokenizer.convert_tokens_to_ids(IM_END)
        pad = self.tokenizer.convert_tokens_to_ids(END_OF_TEXT)
        vocab = -(-len(self.tokenizer) // 64) * 64
        self.config = tiny_chat_config(vocab, eos, pad)
        self.model = Qwen3ForCausalLM(self.config)
        self._init_weights()
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2]
        rest = [p for n, p in self.model.named_parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": settings.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=settings.learning_rate,
            betas=(0.9, 0.98),
        )
        self.batches = Batches(self.tokenizer, settings.seed)

    def _init_weights(self) -> None:
        for name, param in self.model.named_parameters():
            if param.dim() >= 2:
                torch.nn.init.normal_(param, std=0.02)
            if name.endswith(("o_proj.weight", "down_proj.weight")):  # residual branches start small
                torch.nn.init.normal_(param, std=0.02 / math.sqrt(2 * self.config.num_hidden_layers))

    def learning_rate(self, step: int) -> float:
        warmup = min(1.0, (step + 1) / WARMUP_STEPS)
        cosine = 0.5 * (1 + math.cos(math.pi * step / self.settings.num_steps))
        return self.settings.learning_rate * warmup * (0.05 + 0.95 * cosine)

    def train_step(self, step: int) -> float:
        ids, mask = self.batches.next(self.settings.batch_size)
        batch, length = ids.shape
        positions = torch.arange(length).repeat(batch)
        attention = DenseCausalAttention(batch, length, self.config.head_dim**-0.5)
        hidden = self.model(ids.flatten(), positions, attention).unflatten(0, ids.shape)
        logits = self.model.logits(hidden[:, :-1][mask[:, 1:]])  # predict each assistant token
        loss = F.cross_entropy(logits, ids[:, 1:][mask[:, 1:]])
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(step)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        return loss.item()

    def fit(self) -> TrainResult:
        result, window, started = TrainResult(), [], time.monotonic()
        for step in range(self.settings.num_steps):
            window.append(self.train_step(step))
            if (step + 1) % self.settings.log_every == 0 or step + 1 == self.settings.num_steps:
                result.loss_curve.append((step + 1, sum(window) / len(window)))
                window = []
                elapsed = time.monotonic() - started
                print(
                    f"step {step + 1}/{self.settings.num_steps} loss {result.loss_curve[-1][1]:.4f} ({elapsed:.0f} s)",
                    flush=True,
                )
        result.train_time_s = time.monotonic() - started
        return result

    def save(self, weights_dir: Path, settings: TrainSettings, result: TrainResult) -> None:
        from safetensors.torch import save_file

        weights_dir.mkdir(parents=True, exist_ok=True)
        state = {
            n: t.detach().contiguous() for n, t in self.model.state_dict().items() if n != "lm_head.weight"
        }
        save_file(state, str(weights_dir / "model.safetensors"), metadata={"format": "pt"})
        (weights_dir / "config.json").write_text(json.dumps(self.config.to_hf(), indent=2) + "\n")
        generation = {"eos_token_id": [self.config.eos_token_id], "bos_token_id": self.config.bos_token_id}
        (weights_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        save_tokenizer(self.tokenizer, weights_dir)
        training = {
            "settings": settings.__dict__,
            "loss_curve": result.loss_curve,
            "train_time_s": round(result.train_time_s, 1),
            "num_parameters": sum(p.numel() for p in self.model.parameters()),
            "torch": torch.__version__,
        }
        (weights_dir / "training.json").write_text(json.dumps(training, indent=2) + "\n")


def parse_args(argv: list[str] | None) -> tuple[TrainSettings, Path, int]:
    defaults = TrainSettings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=defaults.num_steps)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--threads", type=int, default=1, help="the machine is shared: one core by default")
    parser.add_argument("--weights-dir", type=Path, default=WEIGHTS_DIR)
    args = parser.parse_args(argv)
    return (
        TrainSettings(args.steps, args.batch_size, args.learning_rate, seed=args.seed),
        args.weights_dir,
        args.threads,
    )


def main(argv: list[str] | None = None) -> int:
    settings, weights_dir, threads = parse_args(argv)
    torch.set_num_threads(threads)
    trainer = Trainer(settings)
    print(f"tiny-chat: {sum(p.numel() for p in trainer.model.parameters()):,} parameters", flush=True)
    result = trainer.fit()
    trainer.save(weights_dir, settings, result)
    print(f"wrote {weights_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
