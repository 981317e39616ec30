"""Draw digits 0-9 with the shipped weights into one PNG: `python -m mstar.models.tiny_digits.sheet`.

Rows are seeds, columns digits 0..9; each cell is a served 256x256 frame shrunk to `cell` pixels.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from mstar.graph import GenerationParams
from mstar.models.tiny_digits import data

DEFAULT_OUTPUT = Path("docs/tiny_digits_sheet.png")


def render_sheet(output: Path, num_rows: int = 2, cell_px: int = 64, steps: int | None = None) -> Path:
    import torch
    from PIL import Image

    from mstar.models.tiny_digits.offline import build_local_nodes, generate

    torch.set_num_threads(1)
    requests = [
        GenerationParams(prompt=data.prompt_for(digit, 2 + row), seed=row, num_inference_steps=steps)
        for row in range(num_rows)
        for digit in range(10)
    ]
    frames = generate(build_local_nodes(), requests)  # uint8 [1, 256, 256, 3] each
    cells = [Image.fromarray(f[0]).resize((cell_px, cell_px), Image.Resampling.BILINEAR) for f in frames]
    rows = [
        np.concatenate([np.asarray(c) for c in cells[r * 10 : (r + 1) * 10]], axis=1) for r in range(num_rows)
    ]
    output.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.concatenate(rows, axis=0)).save(output, optimize=True)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--cell", type=int, default=64, help="pixels per digit in the sheet")
    args = parser.parse_args(argv)
    print(render_sheet(args.output, args.rows, args.cell))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
