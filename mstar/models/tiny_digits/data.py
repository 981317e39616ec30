"""Training data: scikit-learn's 8x8 handwritten digits (bundled with it, no download), upscaled.

Images are float32 [N, 1, 1, S, S] (one-frame videos) in [-1, 1] with ink = +1. Prompts come from
templates such as "a handwritten 7" or "the digit seven"; the classifier helpers here turn any
image back into the 8x8 ink grid scikit-learn's digits use, so a generated image and a real one are
judged the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

# {d} is the digit character, {w} its English word.
PROMPT_TEMPLATES = (
    "{d}",
    "{w}",
    "a handwritten {d}",
    "a handwritten {w}",
    "the digit {w}",
    "the digit {d}",
    "number {d}",
    "the number {w}",
    "a drawing of the digit {d}",
    "a drawing of a {w}",
    "a picture of the number {d}",
    "an image of a handwritten {w}",
)

MAX_INK = 16.0  # scikit-learn digits use ink levels 0..16
HELD_OUT_FRACTION = 0.25
SPLIT_SEED = 0


@dataclass
class DigitSplit:
    images_8px: np.ndarray  # float32 [N, 8, 8], ink 0..16
    labels: np.ndarray  # int64 [N]


def load_splits() -> tuple[DigitSplit, DigitSplit]:
    """(train, held_out), a fixed stratified split: the classifier is scored on held_out only."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    train_x, test_x, train_y, test_y = train_test_split(
        digits.images.astype(np.float32),
        digits.target.astype(np.int64),
        test_size=HELD_OUT_FRACTION,
        random_state=SPLIT_SEED,
        stratify=digits.target,
    )
    return DigitSplit(train_x, train_y), DigitSplit(test_x, test_y)


def upscale_to_model(images_8px: np.ndarray, image_size: int):
    """8x8 ink grids -> torch float32 [N, 1, 1, S, S] in [-1, 1] (bilinear, so strokes are smooth)."""
    import torch
    import torch.nn.functional as F

    ink = torch.from_numpy(images_8px).float().unsqueeze(1) / MAX_INK  # [N, 1, 8, 8] in [0, 1]
    big = F.interpolate(ink, size=(image_size, image_size), mode="bilinear", align_corners=False)
    return (big * 2.0 - 1.0).unsqueeze(2)  # [N, 1, 1, S, S]


def ink_grid_from_model(pixels) -> np.ndarray:
    """Model pixels [N, 1, 1, S, S] in [-1, 1] -> ink grids [N, 8, 8] in 0..16 (area average)."""
    import torch.nn.functional as F

    ink = (pixels[:, :, 0].float().clamp(-1, 1) + 1.0) / 2.0  # [N, 1, S, S]
    return (F.adaptive_avg_pool2d(ink, 8)[:, 0] * MAX_INK).numpy()


def ink_grid_from_frames(frames: np.ndarray) -> np.ndarray:
    """Served frames uint8 [N, H, W, 3] (dark ink on white) -> ink grids [N, 8, 8] in 0..16."""
    num_images, height, width, _ = frames.shape
    ink = 1.0 - frames.astype(np.float32).mean(axis=-1) / 255.0  # [N, H, W]
    blocks = ink.reshape(num_images, 8, height // 8, 8, width // 8)
    return blocks.mean(axis=(2, 4)) * MAX_INK


def prompt_for(digit: int, template_index: int) -> str:
    template = PROMPT_TEMPLATES[template_index % len(PROMPT_TEMPLATES)]
    return template.format(d=str(digit), w=DIGIT_WORDS[digit])


def train_classifier(split: DigitSplit):
    """An SVM on the 8x8 ink grids (fits in well under a second)."""
    from sklearn.svm import SVC

    classifier = SVC(gamma=0.001, C=10.0)
    classifier.fit(split.images_8px.reshape(len(split.labels), -1), split.labels)
    return classifier


def classify(classifier, ink_grids: np.ndarray) -> np.ndarray:
    return classifier.predict(ink_grids.reshape(len(ink_grids), -1))
