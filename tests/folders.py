"""Tiny diffusers-layout model folders for tests, written the way the parity harness writes full-size
ones: the family's reference pipeline (tiny config, random weights, a real tokenizer built offline)
saved with save_pretrained. A family with a parity hook gets its folder, its reference pipeline
loaded back from it and our nodes built from it:

    folder = TinyFolder.write("wan2.2-ti2v-5b", tmp_path)
    folder.reference              # WanPipeline.from_pretrained(folder)
    folder.nodes                  # our nodes, built from the same folder on the CPU
    folder.family                 # mstar.bench.parity.ParityFamily (request, cases, hooks)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mstar.bench.parity import ParityOptions, build_ours
from mstar.bench.parity_families import parity_family

DEVICE = "cpu"


@dataclass
class TinyFolder:
    path: Path
    family: Any
    reference: Any
    nodes: dict[str, Any]

    @classmethod
    def write(cls, model: str, path: Path, variant: str | None = None, seed: int = 0) -> TinyFolder:
        family = parity_family(model, variant, tiny=True)
        family.write_folder(path, DEVICE, seed)
        reference = family.load_reference(path, DEVICE)
        nodes = build_ours(family.spec, path, ParityOptions(model=model, device=DEVICE, tiny=True))
        return cls(path, family, reference, nodes)

    def with_variant(self, variant: str) -> TinyFolder:
        """The same folder, pipeline and nodes under another of the family's variants (Wan's i2v)."""
        family = parity_family(self.family.model, variant, tiny=True)
        return TinyFolder(self.path, family, self.reference, self.nodes)

    def encode_ours(self, prompt: str) -> Any:
        return self.nodes["text_encoder"].pipeline.text_encoder.encode([prompt])[0]

    def encode_reference(self, prompt: str) -> Any:
        return self.family.encode_reference(self.reference, prompt)
