"""The end-to-end baseline: diffusers' WanPipeline and ZImagePipeline with random weights of the real
configs, the same seeds, steps, guidance and sizes as our serving benchmark's workloads.

Text encoders are timed apart: seeded prompt embeddings are passed in,
so both sides time the DiT loop, the VAE decode and post-processing. Each workload runs eager and
then with the transformer under torch.compile (first call reported apart), sequentially at c=1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mstar.bench.configs import configs_for
from mstar.bench.stats import percentile


@dataclass(frozen=True)
class EndToEndWorkload:
    name: str
    family: str  # "wan" | "zimage"
    kind: str  # "video" | "image"
    width: int
    height: int
    num_frames: int
    num_inference_steps: int
    guidance_scale: float
    tiny: bool = False

    def request_fields(self) -> dict[str, Any]:
        """The same workload as fields of an OpenAI-shaped request (for `mstar bench serve`)."""
        body: dict[str, Any] = {
            "num_inference_steps": self.num_inference_steps,
            "guidance_scale": self.guidance_scale,
        }
        if self.kind == "video":
            body["num_frames"] = self.num_frames
        return body


E2E_WORKLOADS: dict[str, EndToEndWorkload] = {
    w.name: w
    for w in (
        EndToEndWorkload("wan-480p-t2v", "wan", "video", 832, 480, 33, 50, 5.0),
        EndToEndWorkload("wan-720p-t2v", "wan", "video", 1280, 704, 121, 50, 5.0),
        EndToEndWorkload("zimage-1024", "zimage", "image", 1024, 1024, 1, 9, 0.0),
        EndToEndWorkload("zimage-512", "zimage", "image", 512, 512, 1, 9, 0.0),  # where host time may bound
        EndToEndWorkload("tiny-wan-t2v", "wan", "video", 64, 64, 5, 2, 5.0, tiny=True),
        EndToEndWorkload("tiny-zimage", "zimage", "image", 64, 64, 1, 2, 0.0, tiny=True),
    )
}


@dataclass
class PipelineOptions:
    workloads: list[str]
    modes: list[str] = field(default_factory=lambda: ["eager", "compiled"])
    num_warmup: int = 1
    num_timed: int = 3
    num_inference_steps: int | None = None  # override every workload's steps (quick runs)
    device: str = "cuda"
    seed: int = 0


def build_pipeline(workload: EndToEndWorkload, device: str, seed: int, dit_dtype: Any = None) -> Any:
    """The diffusers pipeline with seeded random weights: DiT in bf16, Wan VAE in fp32 (as diffusers'
    examples load it), no text encoder or tokenizer (embeddings are passed in). The DiT is cast as
    from_pretrained(torch_dtype=bf16) would: its _keep_in_fp32_modules stay fp32."""
    import torch

    from mstar.bench.dit_inputs import build_diffusers_transformer

    configs = configs_for(workload.family, tiny=workload.tiny)
    if dit_dtype is None:
        dit_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(seed)
    if workload.family == "wan":
        from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline

        transformer = build_diffusers_transformer("wan", configs["transformer"], device, dit_dtype, seed)
        with torch.device(device):
            vae = AutoencoderKLWan(**configs["vae"]).to(torch.float32)
        scheduler = UniPCMultistepScheduler(**configs["scheduler"])
        return WanPipeline(
            tokenizer=None,
            text_encoder=None,
            vae=vae,
            scheduler=scheduler,
            transformer=transformer,
            expand_timesteps=True,
        )
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline

    transformer = build_diffusers_transformer("zimage", configs["transformer"], device, dit_dtype, seed)
    with torch.device(device):
        vae = AutoencoderKL(**configs["vae"]).to(dit_dtype)
    scheduler = FlowMatchEulerDiscreteScheduler(**configs["scheduler"])
    return ZImagePipeline(
        scheduler=scheduler, vae=vae, text_encoder=None, tokenizer=None, transformer=transformer
    )


def prompt_kwargs(workload: EndToEndWorkload, device: str, seed: int, dtype: Any) -> dict[str, Any]:
    """Seeded stand-ins for the text encoders' outputs, shaped as the pipelines expect them."""
    import torch

    configs = configs_for(workload.family, tiny=workload.tiny)
    generator = torch.Generator().manual_seed(seed + 1)
    tokens = configs["text_tokens"]
    if workload.family == "wan":
        shape = (1, tokens, configs["transformer"]["text_dim"])
        positive, negative = (torch.randn(shape, generator=generator).to(device, dtype) for _ in range(2))
        return {"prompt_embeds": positive, "negative_prompt_embeds": negative}
    shape = (tokens, configs["transformer"]["cap_feat_dim"])
    return {"prompt_embeds": [torch.randn(shape, generator=generator).to(device, dtype)]}


def _call_kwargs(workload: EndToEndWorkload, options: PipelineOptions, dtype: Any) -> dict[str, Any]:
    import torch

    kwargs = prompt_kwargs(workload, options.device, options.seed, dtype)
    kwargs.update(
        width=workload.width,
        height=workload.height,
        num_inference_steps=options.num_inference_steps or workload.num_inference_steps,
        guidance_scale=workload.guidance_scale,
        output_type="np",
        generator=torch.Generator().manual_seed(options.seed),
    )
    if workload.family == "wan":
        kwargs["num_frames"] = workload.num_frames
    return kwargs


def _timed_call(pipe: Any, kwargs: dict[str, Any], device: str) -> float:
    import torch

    start = time.perf_counter()
    pipe(**kwargs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench_pipeline_mode(
    pipe: Any, workload: EndToEndWorkload, mode: str, options: PipelineOptions
) -> dict[str, Any]:
    import torch

    on_cuda = options.device.startswith("cuda")
    if mode == "compiled":
        pipe.transformer.compile()
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    dtype = pipe.transformer.dtype
    first_call_s = _timed_call(pipe, _call_kwargs(workload, options, dtype), options.device)
    for _ in range(max(0, options.num_warmup - 1)):
        _timed_call(pipe, _call_kwargs(workload, options, dtype), options.device)
    latencies_s = [
        _timed_call(pipe, _call_kwargs(workload, options, dtype), options.device)
        for _ in range(options.num_timed)
    ]
    return {
        "workload": workload.name,
        "mode": mode,
        "kind": workload.kind,
        "size": f"{workload.width}x{workload.height}x{workload.num_frames}",
        "num_inference_steps": options.num_inference_steps or workload.num_inference_steps,
        "guidance_scale": workload.guidance_scale,
        "first_call_s": first_call_s,
        "latencies_s": latencies_s,
        "latency_p50_s": percentile(latencies_s, 50),
        "sequential_per_minute": 60.0 * len(latencies_s) / sum(latencies_s) if latencies_s else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None,
    }


def run_pipeline_benchmark(options: PipelineOptions) -> dict[str, Any]:
    import torch

    results = []
    for name in options.workloads:
        workload = E2E_WORKLOADS[name]
        pipe = build_pipeline(workload, options.device, options.seed)
        with torch.inference_mode():
            for mode in options.modes:  # eager first: compiling changes the module in place
                results.append(bench_pipeline_mode(pipe, workload, mode, options))
        del pipe
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    notes = ["text encoders timed apart: seeded prompt embeddings passed in (UMT5 / Qwen3 outputs)"]
    return {
        "benchmark": "diffusers",
        "title": "diffusers pipelines end to end",
        "options": vars(options),
        "results": results,
        "notes": notes,
    }
