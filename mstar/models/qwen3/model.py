"""Qwen3 (dense) as the runtime and API see it: the LLM spec over transformers' Qwen3 folders.

Light (no torch at import). `--model-path DIR` is a transformers Qwen3ForCausalLM folder
(config.json, *.safetensors, the tokenizer files with their chat template, generation_config.json);
its config wins. `qwen3-0.6b` ... `qwen3-8b` name the released shapes for `--random-weights` without a
folder (the byte-level fallback tokenizer then stands in). `qwen3` needs a folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar.graph import BuildContext, Node
from mstar.llm.spec import LLMSpec
from mstar.models.qwen3.config import QWEN3_CONFIGS, Qwen3Config


class Qwen3Spec(LLMSpec):
    name = "qwen3"
    default_config: Qwen3Config | None = None  # a released size, for --random-weights without a folder
    weights_dir: Path | None = None  # embedded weights (tiny-chat), used when no --model-path is given

    def folder(self, config: Any) -> Path | None:
        if config.model_path:
            return Path(config.model_path)
        return self.weights_dir

    def model_config(self, config: Any) -> Qwen3Config:
        folder = self.folder(config)
        if folder is not None and (folder / "config.json").is_file():
            return Qwen3Config.load(folder)
        if self.default_config is not None:
            return self.default_config
        raise ValueError(
            f"{self.name}: give --model-path DIR (a transformers Qwen3 folder), or serve a named size "
            f"({', '.join(QWEN3_CONFIGS)}) with --random-weights"
        )

    def load_tokenizer(self, config: Any) -> Any:
        from mstar.llm.tokenizer import load_text_tokenizer

        return load_text_tokenizer(self.folder(config), self.model_config(config).vocab_size)

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        from mstar.models.qwen3.nodes import build_qwen3_nodes

        return build_qwen3_nodes(self, ctx)


class Qwen3_0_6BSpec(Qwen3Spec):  # noqa: N801 (the model's name)
    name = "qwen3-0.6b"
    default_config = QWEN3_CONFIGS["qwen3-0.6b"]


class Qwen3_1_7BSpec(Qwen3Spec):  # noqa: N801
    name = "qwen3-1.7b"
    default_config = QWEN3_CONFIGS["qwen3-1.7b"]


class Qwen3_4BSpec(Qwen3Spec):  # noqa: N801
    name = "qwen3-4b"
    default_config = QWEN3_CONFIGS["qwen3-4b"]


class Qwen3_8BSpec(Qwen3Spec):  # noqa: N801
    name = "qwen3-8b"
    default_config = QWEN3_CONFIGS["qwen3-8b"]
