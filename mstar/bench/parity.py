"""`mstar bench parity MODEL`: our nodes against the model's diffusers pipeline on the same folder.

    mstar bench parity wan2.2-ti2v-5b --device cuda              # t2v at full size, random weights
    mstar bench parity wan2.2-ti2v-5b --variant i2v --device cuda
    mstar bench parity z-image-turbo --device cuda
    mstar bench parity wan2.2-ti2v-5b --tiny --device cpu         # the same run on tiny configs

The family's hook (its bench entry's `parity`, found by mstar.bench.parity_families) builds the reference pipeline from the model's
real config with random weights and a tokenizer built offline, and writes it with save_pretrained
to a temporary folder. The reference is loaded back from that folder (a pipeline kept in memory is
not what was written) and our nodes are built from it. For one prompt and seed it compares the
prompt embeddings (and the default negative prompt's), the final latents and the frames (floats
before any encoding: MP4 cannot show parity on random-weight noise) of a one-step run without
guidance and of a run at the model's default steps and guidance.

Each figure stands beside the reference's own kernel noise: the reference again with another
attention implementation (its text encoder in transformers' eager attention; the whole pipeline
with SDPA limited to the memory-efficient and math kernels, math alone on the CPU). A figure of
ours near its yardstick is as close as the reference is to itself. The text encoder's sensitivity
(output change for a 1e-3 relative change of its input embeddings) says whether the random
weights make the comparison meaningful at all: a chaotic encoder turns any rounding into O(1).

A family may add DiT rows (one step's prediction against the reference transformer's) with a limit
each; `mstar bench parity` exits 1 when any row is over its limit.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SENSITIVITY_EPS = 1e-3
LATENTS, FRAMES, INPUT_REFERENCE = "latents", "frames", "input_reference"


@dataclass(frozen=True)
class ParityCase:
    name: str
    num_inference_steps: int
    guidance_scale: float


@dataclass
class ParityFamily:
    """What the harness needs of a model family; one small function per family builds it."""

    model: str
    variant: str
    spec: Any  # our ModelSpec at the size being checked
    request: dict[str, Any]  # GenerationParams fields every case shares (prompt, size, seed)
    cases: list[ParityCase]
    write_folder: Callable[[Path, str, int], None]  # (folder, device, seed): random weights, saved
    load_reference: Callable[[Path, str], Any]  # (folder, device) -> the pipeline
    encode_reference: (
        Callable[[Any, str], Any] | None
    )  # (pipeline, prompt) -> [num_tokens, dim]; None: no encoder
    run_reference: Callable[[Any, dict[str, Any], str], Any]  # (pipeline, fields, "latent" | "np")
    input_image: Any = None  # uint8 [H, W, 3] for image-to-video
    # (pipeline, our nodes, prompt) -> [(what, rel err against the pipeline's embedding)]: other
    # ways of running our encoder, to tell where a difference comes from
    text_diagnostics: Callable[[Any, dict[str, Any], str], list[tuple[str, float]]] | None = None
    # (pipeline, our nodes, request fields) -> rows: the prompt's side of a model with no text
    # encoder (its prompt tokens go straight into the DiT), in place of the embedding rows
    prompt_rows: Callable[[Any, dict[str, Any], dict[str, Any]], list[dict[str, Any]]] | None = None
    # (pipeline, our nodes, request fields, device) -> rows: the DiT's own prediction against the
    # reference transformer's on one input; a row with a "limit" fails the run when it exceeds it
    dit_rows: Callable[[Any, dict[str, Any], dict[str, Any], str], list[dict[str, Any]]] | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class ParityOptions:
    model: str
    variant: str | None = None  # None: the family's first (Wan: t2v, then i2v)
    device: str = "cuda"
    tiny: bool = False
    seed: int = 0
    compile_mode: str = "off"
    num_inference_steps: int | None = None  # the default case's steps (None: the model's default)
    folder: str | None = None  # a fresh folder for the reference is made in it (default: the temp dir)
    keep_folder: bool = False


def rel_err(ours: Any, theirs: Any) -> float:
    """||ours - theirs|| / ||theirs|| in float64 (shapes must agree once leading 1s are dropped)."""
    a, b = _squeezed(ours), _squeezed(theirs)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: ours {tuple(a.shape)}, reference {tuple(b.shape)}")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def psnr_db(ours: Any, theirs: Any) -> float:
    """PSNR of two pictures as uint8 pixels: float ones in [0, 1] (a pipeline's "np" output) are
    rounded to the nearest of 256 levels first, as our decoder's uint8 frames are."""
    a, b = _as_levels(ours), _as_levels(theirs)
    if a.numel() != b.numel():
        raise ValueError(f"frames differ in size: ours {tuple(a.shape)}, reference {tuple(b.shape)}")
    mse = float(((a.reshape(-1) - b.reshape(-1)) ** 2).mean())
    return float("inf") if mse == 0 else 10.0 * math.log10(255.0**2 / mse)


def _as_levels(value: Any):
    """Pixel levels 0..255 as float64 (uint8 as they are, floats in [0, 1] rounded)."""
    import torch

    tensor = _tensor(value)
    if tensor.dtype == torch.uint8:
        return _squeezed(tensor)
    return (_squeezed(tensor).clamp(0, 1) * 255).round()


def _tensor(value: Any):
    import numpy as np
    import torch

    return value.detach().cpu() if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))


def _squeezed(value: Any):
    """float64 on the host, leading 1s dropped."""
    import torch

    tensor = _tensor(value).to(torch.float64)
    while tensor.dim() > 1 and tensor.shape[0] == 1:
        tensor = tensor[0]
    return tensor


@contextlib.contextmanager
def other_attention_kernels(device: str) -> Iterator[None]:
    """SDPA limited to kernels the default dispatch does not pick first (the yardstick's run)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    on_cuda = device.startswith("cuda")
    backends = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH] if on_cuda else [SDPBackend.MATH]
    with sdpa_kernel(backends):
        yield


@contextlib.contextmanager
def eager_attention(model: Any) -> Iterator[None]:
    """A transformers model with its attention in the eager implementation, then as it was."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@contextlib.contextmanager
def perturbed_input_embeddings(model: Any, eps: float, seed: int = 0) -> Iterator[None]:
    """Every lookup of the model's input embedding table scaled by (1 + eps * N(0, 1)), seeded."""
    import torch

    weight = model.get_input_embeddings().weight
    generator = torch.Generator().manual_seed(seed)

    def perturb(_module, _inputs, output):
        noise = torch.randn(output.shape, generator=generator).to(output.device, output.dtype)
        return output * (1 + eps * noise)

    handles = [
        module.register_forward_hook(perturb)
        for module in model.modules()
        if isinstance(module, torch.nn.Embedding) and module.weight is weight
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def build_ours(spec: Any, folder: Path, options: ParityOptions) -> dict[str, Any]:
    """Our nodes from the folder, as a server builds them (no size warmup; CUDA graphs captured)."""
    from mstar.config import ServerConfig
    from mstar.graph import BuildContext

    config = ServerConfig(device=options.device, compile_mode=options.compile_mode, warmup=False)
    ctx = BuildContext(
        config=config, device=options.device, node_names=spec.node_names, model_path=str(folder)
    )
    nodes = spec.build_nodes(ctx)
    for node in nodes.values():
        node.warmup()
    return nodes


def run_ours(spec: Any, nodes: dict[str, Any], fields: dict[str, Any], image: Any = None) -> dict[str, Any]:
    """One request through every walk, in this process; its final latents and uint8 frames."""
    import torch

    from mstar.graph import GenerationParams, RequestState, stage_nodes

    params = spec.validate(GenerationParams(**fields, has_input_reference=image is not None))
    request = RequestState("parity", params)
    if image is not None:
        request.tensors[INPUT_REFERENCE] = torch.from_numpy(image)
    kept: dict[str, Any] = {}
    walk = spec.first_walk(params)
    while walk is not None:
        for stage in spec.walks[walk].stages:
            for name in stage_nodes(stage):
                _run_node(nodes[name], request)
            if LATENTS in request.tensors:  # the decoder takes them: keep a copy
                kept[LATENTS] = request.tensors[LATENTS].detach().float().cpu().clone()
        walk = spec.next_walk(params, walk)
    kept[FRAMES] = request.tensors[FRAMES].cpu()
    return kept


def _run_node(node: Any, request: Any) -> None:
    node.prepare(request)
    node.forward([request])
    while not node.check_stop(request):
        node.forward([request])
    node.release(request)


def text_rows(family: ParityFamily, reference: Any, nodes: dict[str, Any]) -> list[dict[str, Any]]:
    """Prompt embeddings (the prompt and the default negative prompt) and the encoder's sensitivity;
    a family without a text encoder gives its own prompt rows."""
    import torch

    if family.encode_reference is None:
        return family.prompt_rows(reference, nodes, family.request) if family.prompt_rows else []
    rows = []
    encoder = reference.text_encoder
    prompts = {"prompt embeddings": family.request["prompt"], "negative prompt embeddings ('')": ""}
    with torch.inference_mode():
        for quantity, prompt in prompts.items():
            theirs = family.encode_reference(reference, prompt)
            ours = nodes["text_encoder"].pipeline.text_encoder.encode([prompt])[0]
            with eager_attention(encoder):
                eager = family.encode_reference(reference, prompt)
            rows.append(
                parity_row(quantity, "-", "rel err", rel_err(ours, theirs), rel_err(eager, theirs),
                     "reference, eager attention", num_tokens=int(theirs.shape[0]))
            )  # fmt: skip
        theirs = family.encode_reference(reference, family.request["prompt"])
        if family.text_diagnostics is not None:
            for what, value in family.text_diagnostics(reference, nodes, family.request["prompt"]):
                rows.append(parity_row(f"prompt embeddings, {what}", "-", "rel err", value, None, "-"))
        with perturbed_input_embeddings(encoder, SENSITIVITY_EPS, seed=family.request.get("seed", 0)):
            perturbed = family.encode_reference(reference, family.request["prompt"])
    rows.append(
        parity_row("text encoder sensitivity", "-", f"rel change for {SENSITIVITY_EPS:g} input change", None,
             rel_err(perturbed, theirs), "reference, perturbed input embeddings")
    )  # fmt: skip
    return rows


def case_rows(family: ParityFamily, reference: Any, nodes: dict[str, Any], case: ParityCase, device: str):
    import torch

    fields = dict(
        family.request, num_inference_steps=case.num_inference_steps, guidance_scale=case.guidance_scale
    )
    with torch.inference_mode():
        theirs = {kind: family.run_reference(reference, fields, kind) for kind in ("latent", "np")}
        with other_attention_kernels(device):
            other = {kind: family.run_reference(reference, fields, kind) for kind in ("latent", "np")}
    ours = run_ours(family.spec, nodes, fields, family.input_image)
    yardstick = "reference, other SDPA kernels"
    return [
        parity_row("latents", case.name, "rel err", rel_err(ours[LATENTS], theirs["latent"]),
             rel_err(other["latent"], theirs["latent"]), yardstick),
        parity_row("frames", case.name, "PSNR dB", psnr_db(ours[FRAMES], theirs["np"]),
             psnr_db(other["np"], theirs["np"]), yardstick),
    ]  # fmt: skip


def with_default_steps(cases: list[ParityCase], num_steps: int) -> list[ParityCase]:
    """The cases with the last (the model's defaults) at `num_steps`, its guidance kept."""
    *first, default = cases
    return [*first, ParityCase(f"{num_steps} steps", num_steps, default.guidance_scale)]


def parity_row(quantity, case, metric, ours, yardstick, yardstick_how, **extra) -> dict[str, Any]:
    return {"quantity": quantity, "case": case, "metric": metric, "ours": ours, "yardstick": yardstick,
            "yardstick_how": yardstick_how, **extra}  # fmt: skip


def run_parity(options: ParityOptions) -> dict[str, Any]:
    """The whole check; `options.variant` may list several ("t2v,i2v"): one folder, one reference
    and one set of our nodes serve them all (their text rows are the same, so they run once)."""
    families = _families(options)
    family = families[0]
    if options.folder is not None:
        Path(options.folder).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="mstar-parity-", dir=options.folder))
    timings_s: dict[str, float] = {}
    try:
        with _timed(timings_s, "write_reference"):
            family.write_folder(folder, options.device, options.seed)
        with _timed(timings_s, "load_reference"):
            reference = family.load_reference(folder, options.device)
        with _timed(timings_s, "build_ours"):
            nodes = build_ours(family.spec, folder, options)
        with _timed(timings_s, "text"):
            rows = text_rows(family, reference, nodes)
        if family.dit_rows is not None:
            with _timed(timings_s, "dit"):
                rows += family.dit_rows(reference, nodes, family.request, options.device)
        for variant in families:
            for case in variant.cases:
                label = f"{variant.variant} {case.name}" if len(families) > 1 else case.name
                with _timed(timings_s, f"case {label}"):
                    new_rows = case_rows(variant, reference, nodes, case, options.device)
                rows += [row | {"case": label} for row in new_rows]
    finally:
        if not options.keep_folder:
            shutil.rmtree(folder, ignore_errors=True)
    variants = ",".join(f.variant for f in families)
    return {
        "benchmark": "parity",
        "title": f"{family.model} {variants}{' (tiny)' if options.tiny else ''}: ours vs the pipeline",
        "options": vars(options),
        "request": family.request,
        "rows": rows,
        "timings_s": timings_s,
        "folder": str(folder) if options.keep_folder else None,
        "notes": family.notes,
        "limits_exceeded": limits_exceeded(rows),
    }


def limits_exceeded(rows: list[dict[str, Any]]) -> list[str]:
    """The rows over their "limit" (a missing or NaN figure counts as over), as short lines."""
    return [
        f"{row['quantity']}, {row['case']}: {_fmt(row['ours'], row['metric'])} > {row['limit']:g}"
        for row in rows
        if row.get("limit") is not None and not (row["ours"] is not None and row["ours"] <= row["limit"])
    ]


def _families(options: ParityOptions) -> list[ParityFamily]:
    from mstar.bench.parity_families import parity_family

    variants = [v.strip() for v in options.variant.split(",")] if options.variant else [None]
    families = [parity_family(options.model, variant, tiny=options.tiny) for variant in variants]
    for family in families:
        if options.num_inference_steps is not None:
            family.cases = with_default_steps(family.cases, options.num_inference_steps)
    return families


@contextlib.contextmanager
def _timed(timings_s: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timings_s[name] = time.perf_counter() - start


def _fmt(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    if metric.startswith("ids"):
        return str(int(value))
    if metric.startswith("PSNR"):
        return "inf" if value == float("inf") else f"{value:.1f}"
    return f"{value:.2e}"


def parity_table(result: dict[str, Any]) -> str:
    lines = [
        "| quantity | case | metric | ours vs reference | reference vs itself | yardstick |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['quantity']} | {row['case']} | {row['metric']} | {_fmt(row['ours'], row['metric'])} | "
            f"{_fmt(row['yardstick'], row['metric'])} | {row['yardstick_how']} |"
        )
    checked = [row for row in result["rows"] if row.get("limit") is not None]
    exceeded = result.get("limits_exceeded") or []
    if exceeded:
        lines.append(f"\nLIMITS EXCEEDED ({len(exceeded)} of {len(checked)} rows): " + "; ".join(exceeded))
    elif checked:
        limits = ", ".join(sorted({f"{row['limit']:g}" for row in checked}))
        lines.append(f"\nWithin limits: {len(checked)} rows ({limits}).")
    timings = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in result.get("timings_s", {}).items())
    return "\n".join(lines) + (f"\n\nTimes: {timings}." if timings else "")
