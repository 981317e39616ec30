"""Score the trained model with a held-out digit classifier and write the package README (model card)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mstar.graph import GenerationParams
from mstar.models.tiny_digits import data
from mstar.models.tiny_digits.config import CONFIG_FILE, DIT_FILE, TEXT_ENCODER_FILE

CARD_PATH = Path(__file__).parent / "README.md"
SPARK_CHARS = "▁▂▃▄▅▆▇█"
NUM_EVAL_SEEDS = 10
EVAL_SETTINGS = ((20, 3.5), (8, 3.5), (20, 1.0))  # (steps, guidance_scale)


def digit_requests(
    num_seeds: int, steps: int, guidance: float, first_seed: int = 0
) -> list[GenerationParams]:
    """Every digit once per seed, each with a different prompt template."""
    return [
        GenerationParams(
            prompt=data.prompt_for(digit, seed * 10 + digit),
            num_inference_steps=steps,
            guidance_scale=guidance,
            seed=first_seed + seed,
        )
        for seed in range(num_seeds)
        for digit in range(10)
    ]


def generated_accuracy(nodes, classifier, num_seeds: int, steps: int, guidance: float) -> float:
    from mstar.models.tiny_digits.offline import generate

    requests = digit_requests(num_seeds, steps, guidance)
    frames = np.concatenate(generate(nodes, requests))  # [N, H, W, 3]
    wanted = np.array([digit for _ in range(num_seeds) for digit in range(10)])
    return float((data.classify(classifier, data.ink_grid_from_frames(frames)) == wanted).mean())


def sparkline(values: list[float]) -> str:
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(SPARK_CHARS[round((v - low) / span * (len(SPARK_CHARS) - 1))] for v in values)


def evaluate_and_write_card(weights_dir: Path, settings, result, num_train_images: int) -> None:
    from mstar.models.tiny_digits.offline import build_local_nodes

    train_split, held_out = data.load_splits()
    classifier = data.train_classifier(train_split)
    classifier_accuracy = float((data.classify(classifier, held_out.images_8px) == held_out.labels).mean())
    nodes = build_local_nodes(weights_dir)
    accuracies = {
        (steps, guidance): generated_accuracy(nodes, classifier, NUM_EVAL_SEEDS, steps, guidance)
        for steps, guidance in EVAL_SETTINGS
    }
    for (steps, guidance), accuracy in accuracies.items():
        print(f"generated digits recognised: {accuracy:.1%} ({steps} steps, guidance {guidance})")
    sizes_kb = {name: (weights_dir / name).stat().st_size // 1024 for name in (DIT_FILE, TEXT_ENCODER_FILE)}
    config = json.loads((weights_dir / CONFIG_FILE).read_text())
    CARD_PATH.write_text(
        _card_text(
            config,
            settings,
            result,
            num_train_images,
            len(held_out.labels),
            classifier_accuracy,
            accuracies,
            sizes_kb,
        )
    )
    print(f"wrote {CARD_PATH}")


def _card_text(
    config, settings, result, num_train, num_held_out, classifier_accuracy, accuracies, sizes_kb
) -> str:
    dit = config["dit"]
    losses = [loss for _, loss in result.loss_curve]
    loss_rows = "\n".join(f"| {step} | {loss:.4f} |" for step, loss in result.loss_curve)
    accuracy_rows = "\n".join(
        f"| {steps} | {guidance} | {accuracy:.1%} |" for (steps, guidance), accuracy in accuracies.items()
    )
    return f"""# tiny-digits (model card)

The embedded default model of mstar: a text-to-image diffusion transformer that draws handwritten
digits, small enough to train in minutes on one CPU core and to serve anywhere without downloads.
It is the Wan2.2 DiT (`mstar/models/wan22/dit.py`, diffusers `WanTransformer3DModel` keys) at a toy
size, served by the same runtime, DenoiseNode, ragged attention and API as the large models.

## Data
scikit-learn's `load_digits` (1797 8x8 grayscale digits, bundled with scikit-learn), stratified
split with seed {data.SPLIT_SEED}: {num_train} images for training, {num_held_out} held out for the classifier
score. Images are upscaled bilinearly to {config["image_size"]}x{config["image_size"]} and treated as one-frame
videos in pixel space, `[C=1, F=1, H, W]` in [-1, 1] (no VAE). Prompts come from {len(data.PROMPT_TEMPLATES)}
templates ("7", "seven", "a handwritten 7", "the digit seven", "number 7", "a drawing of the digit 7", ...);
10% of prompts are replaced by "" for classifier-free guidance.

## Model
- DiT: {dit["num_layers"]} layers, {dit["num_attention_heads"]} heads x {dit["attention_head_dim"]}, ffn {dit["ffn_dim"]}, patch {tuple(dit["patch_size"])}
  ({(config["image_size"] // dit["patch_size"][1]) ** 2} tokens per image), text dim {dit["text_dim"]}; `weights/{DIT_FILE}` ({sizes_kb[DIT_FILE]} KiB).
- Text encoder: word tokenizer (`weights/vocab.json`, unknown words -> `<unk>`, `<bos>` first) and an
  embedding + one self-attention block; `weights/{TEXT_ENCODER_FILE}` ({sizes_kb[TEXT_ENCODER_FILE]} KiB).
- Decoder: pixels -> uint8 {config["output_size"]}x{config["output_size"]} RGB (bilinear upscale, dark ink on white).
- Sampling: flow-match Euler (`FlowMatchEulerSampler`, linear sigmas, shift {config["sampler_shift"]}),
  defaults {config["default_steps"]} steps, guidance {config["default_guidance_scale"]}.

## Serving
`mstar serve` serves it by default (CPU is fine; it boots in seconds). `mstar generate tiny-digits
--prompt "a handwritten 7" -o seven.png`. Limits: size 256x256 only (others are refused naming
`size`), 1-100 steps, guidance 0-20 (above 1 runs the "" prompt, or `negative_prompt`, as the
unconditional side), seeds 0 to 2^63-1 (none: a random one). `--model-path DIR` loads a folder laid out like `weights/`
(config.json, vocab.json, transformer.safetensors, text_encoder.safetensors). Same request, seed and
batch company give the same bytes; in other company a CPU GEMM may round differently (at most 1/255
on a few pixels).

## Training
Rectified flow (x_s = (1 - s) x0 + s noise, target noise - x0, logit-normal s), AdamW lr
{settings.learning_rate} (warm-up, cosine), batch {settings.batch_size}, {settings.num_steps} steps, seed {settings.seed}, EMA
of the weights; one CPU thread (`torch.set_num_threads(1)`): {result.train_time_s / 60:.1f} min wall-clock. Reproduce with
`python -m mstar.models.tiny_digits.train`.

Loss: `{sparkline(losses)}` ({losses[0]:.3f} -> {losses[-1]:.3f})

| step | mean loss |
|---|---|
{loss_rows}

## Accuracy
An SVM trained on the real training digits recognises {classifier_accuracy:.1%} of the held-out real digits
(8x8). Generated images (10 digits x {NUM_EVAL_SEEDS} seeds, one template each, served 256x256 frames
area-averaged back to 8x8) recognised as the requested digit:

| steps | guidance | recognised |
|---|---|---|
{accuracy_rows}

Sample sheet (`python -m mstar.models.tiny_digits.sheet`, 20 steps, guidance 3.5, seeds 0 and 1):
`docs/tiny_digits_sheet.png`.
"""
