"""One validated schema for the YAML config and the CLI flags; echoed at start."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:\d+)?)$")
SIZE_PATTERN = re.compile(r"^\d+x\d+(x\d+)?$")
HOST_NAME_PATTERN = re.compile(r"^(\*|(\*\.)?[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])$")
PUBLIC_URL_PATTERN = re.compile(r"^https?://[^/?#\s]+(/[^?#\s]*)?$")


def check_device(value: str) -> str:
    if not DEVICE_PATTERN.match(value):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got '{value}'")
    return value


class CompileSize(BaseModel):
    """One `compile_sizes` entry, written 'WxH' or 'WxHxFRAMES' in the YAML and parsed here once."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    written_as_text: ClassVar[bool] = True  # a flag takes it as the YAML does: --compile-sizes 832x480
    width: int = Field(gt=0)
    height: int = Field(gt=0)
    num_frames: int | None = Field(None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if not SIZE_PATTERN.match(value):
            raise ValueError(f"compile_sizes entries are 'WxH' or 'WxHxFRAMES', got '{value}'")
        width, height, *frames = (int(part) for part in value.split("x"))
        return {"width": width, "height": height, "num_frames": frames[0] if frames else None}

    @model_serializer
    def _as_text(self) -> str:
        return str(self)

    def __str__(self) -> str:
        frames = "" if self.num_frames is None else f"x{self.num_frames}"
        return f"{self.width}x{self.height}{frames}"


class NodeGroup(BaseModel):
    """Nodes placed on one worker process, on one device."""

    model_config = ConfigDict(extra="forbid")
    device: str = "cpu"
    nodes: list[str]

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        return check_device(value)


class ServerConfig(BaseModel):
    """Every key of the YAML config; each is also a `mstar serve` flag (--some-key), generated from
    this schema with the description as its help (mstar/config_flags.py)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "tiny-digits", description="model name, or 'package.module:SpecClass' (an importable ModelSpec)"
    )
    model_path: str | None = Field(None, description="checkpoint folder in the diffusers layout")
    random_weights: bool = Field(False, description="seeded random weights of the real shapes (benchmarks)")
    device: str = Field("cpu", description="cpu, cuda or cuda:N")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights' dtype; auto: bfloat16 on a GPU, float32 on the CPU"
    )

    host: str = Field("127.0.0.1", description="bind address")
    port: int = Field(8000, ge=0, le=65535, description="port; 0 picks a free one")
    api_key: str | None = Field(
        None,
        description="guards /v1 and /generate (prefer the MSTAR_API_KEY environment variable: a flag shows in the process list)",
    )
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0, description="largest request body (413 above)")
    allowed_hosts: list[str] = Field(
        [],
        description="Host names the Host header may carry besides the loopback ones and public_url's "
        "(others: 400, against DNS rebinding); '*' accepts any; with none, a server bound to loopback "
        "accepts only loopback names and one bound elsewhere any. Origin headers of state-changing "
        "requests must match the Host header or name one of these (else 403)",
    )
    public_url: str | None = Field(
        None,
        description="where clients reach the server ('https://api.example.com'): the base of "
        "response_format=url links; unset: the address the request came in on (never the Host header)",
    )
    max_connections: int = Field(
        512, ge=1, description="connections open at most (more are answered 503 and closed)"
    )
    idle_timeout_s: float = Field(
        5.0,
        gt=0,
        description="a connection without a request this long is closed (before the first and between)",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="408 and closed when a request's headers take longer from its first byte"
    )
    body_timeout_s: float = Field(
        60.0, gt=0, description="408 and closed when the body takes longer after them"
    )
    shutdown_grace_s: float = Field(
        30.0,
        ge=0,
        description="on SIGTERM or SIGINT: how long requests in flight get to finish (then a 503) before "
        "the workers stop and the process exits 0",
    )

    node_groups: list[NodeGroup] = Field(
        [],
        description="placement: worker processes, each [{device, nodes}] (JSON on the command line); "
        "empty: one worker holding every node on `device`",
    )
    transport: Literal["ipc", "tcp"] = Field(
        "ipc", description="how processes talk: ipc sockets or loopback TCP"
    )

    max_concurrent_requests: int = Field(16, ge=1, description="requests running at once")
    max_queue_size: int = Field(64, ge=0, description="requests waiting beyond those (429 above)")
    request_timeout_s: float = Field(1800.0, gt=0, description="a request running longer fails (504)")
    job_ttl_s: float = Field(3600.0, gt=0, description="how long a finished video job and its media stay")
    worker_restart: bool = Field(True, description="restart a worker process that died")
    heartbeat_interval_s: float = Field(
        1.0,
        gt=0,
        description="workers heartbeat this often; one that missed two is stalled (/ready 503, new requests 503)",
    )
    heartbeat_timeout_s: float = Field(
        30.0, gt=0, description="a worker silent this long is killed (its requests fail) and restarted"
    )

    attention_backend: Literal["auto", "fa3", "flashinfer", "torch"] = Field(
        "auto", description="auto: FA3 on Hopper, then FlashInfer, then PyTorch"
    )
    flashinfer_backend: Literal["auto", "fa2", "fa3", "cudnn", "cutlass"] = Field(
        "auto", description="FlashInfer's own kernel family"
    )
    workspace_mb: int = Field(512, ge=1, description="attention workspace per device, allocated at boot")

    compile_mode: Literal["deterministic", "default", "max-autotune", "off"] = Field(
        "deterministic",
        description="torch.compile mode; deterministic: kernel choices by rule, so one seed gives one "
        "output on every process",
    )
    compile_sizes: list[CompileSize] = Field(
        [],
        description="sizes compiled at warmup, 'WxH' or 'WxHxFRAMES' (the model's default size if none); "
        "other sizes run at once uncompiled while theirs compiles in the background",
    )
    compile_cache_dir: str | None = Field(
        None,
        description="where compiled kernels are kept across restarts (torch's default under /tmp if "
        "unset); a warm cache cut Wan's boot from 161 s to 48 s on an H200",
    )
    cuda_graphs: bool = Field(
        True,
        description="launch-bound parts replay CUDA graphs captured at warmup (Z-Image's prompt encoder)",
    )
    warmup: bool = Field(True, description="compile and run a request of each compile size before serving")
    fuse_projections: bool = Field(
        True,
        description="DiT q/k/v (and Z-Image gate/up) projections as one GEMM each; CUDA only (the CPU "
        "path stays the plain reference)",
    )
    triton_kernels: bool = Field(
        True,
        description="hand-written Triton kernels for the DiTs' q/k norm + rotary and residual updates "
        "where inductor's are slower; CUDA with fuse_projections",
    )
    max_tokens_per_step: int = Field(131072, ge=1, description="most packed tokens in one denoise step")
    max_batch_size: int = Field(8, ge=1, description="most requests in one step of a node")
    prompt_cache_mb: int = Field(
        64,
        ge=0,
        description="prompt embeddings kept on the text encoder's device for texts that come back (0: off)",
    )
    kept_text_mb: int = Field(
        16384,
        ge=0,
        description="device memory a DiT node gives what its requests keep from their text across steps "
        "(text cross-attention keys and values: LTX-2 2.4 GB a guided request, Wan2.2 0.4 GB); past it a "
        "request recomputes them each step until room frees (0: never kept)",
    )
    offload_text_encoder: bool = Field(
        False,
        description="keep the text encoder's weights in host memory and stream them per prompt (Wan2.2: "
        "~0.7 GiB on the GPU instead of ~8.6, ~0.1 s more a request)",
    )
    stream_video_frames: bool = Field(
        True, description="mux a clip's MP4 chunk by chunk as the VAE decodes it (off: whole clip at the end)"
    )

    # Text models (LLM serving): the paged KV pool is sized at boot from the memory left after the
    # weights and the workspace; FlashInfer builds its kernels at boot, under
    # compile_cache_dir/flashinfer when that is set.
    kv_page_tokens: int = Field(16, ge=1, le=1024, description="tokens in one page of the paged KV pool")
    kv_cache_memory_fraction: float = Field(
        0.85, gt=0, le=1, description="share of the memory left after weights and workspace the KV pool takes"
    )
    kv_pool_pages: int | None = Field(
        None, ge=1, description="KV pool size in pages (overrides kv_cache_memory_fraction)"
    )
    kv_attention_backend: Literal["auto", "flashinfer", "fa3", "torch"] = Field(
        "auto", description="paged attention kernels of text models (auto: flashinfer on CUDA, torch on CPU)"
    )
    enable_prefix_caching: bool = Field(
        True, description="reuse the KV pages of a shared prompt prefix across requests"
    )
    max_num_seqs: int = Field(
        128,
        ge=1,
        description="most sequences in one text-model step (decode CUDA graphs: this many rows, at least 128)",
    )
    max_num_batched_tokens: int = Field(
        8192, ge=1, description="most tokens in one text-model step (decode rows, then chunked prefill)"
    )
    max_model_len: int | None = Field(
        None, ge=2, description="longest prompt plus output of a text model (default: its context length)"
    )

    # Per-request LoRA adapters (mstar.adapters, mstar.engine.lora)
    lora_dir: str | None = Field(
        None,
        description="Folder of LoRA adapters requests may name (diffusers / PEFT safetensors: "
        "<name>.safetensors or <name>/pytorch_lora_weights.safetensors); listed by GET /v1/loras. "
        "Unset: requests cannot name adapters.",
    )
    max_loras: int = Field(
        8, ge=1, description="Adapters resident on the device at once (an LRU; each takes one slot)."
    )
    max_lora_rank: int = Field(
        64,
        ge=8,
        multiple_of=8,
        description="Largest adapter rank served; smaller ranks are zero-padded to it in the slots "
        "(memory and the adapter's share of a step grow with it). Adapters above it are refused.",
    )
    max_loras_per_request: int = Field(
        2, ge=1, description="Adapters one request may name (their updates add up)."
    )

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        return check_device(value)

    @field_validator("allowed_hosts")
    @classmethod
    def _check_hosts(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if not HOST_NAME_PATTERN.match(host):
                raise ValueError(f"allowed_hosts entries are host names without scheme or port, got '{host}'")
        return [host.lower().rstrip(".") for host in hosts]

    @field_validator("public_url")
    @classmethod
    def _check_public_url(cls, url: str | None) -> str | None:
        if url is not None and not PUBLIC_URL_PATTERN.match(url):
            raise ValueError(f"public_url must be an http:// or https:// URL, got '{url}'")
        return None if url is None else url.rstrip("/")

    @model_validator(mode="after")
    def _check_heartbeats(self) -> ServerConfig:
        if self.heartbeat_timeout_s <= 3 * self.heartbeat_interval_s:
            raise ValueError("heartbeat_timeout_s must be above 3 heartbeat_interval_s")
        return self

    @model_validator(mode="after")
    def _check_loras(self) -> ServerConfig:
        if self.max_loras_per_request > self.max_loras:
            raise ValueError(
                f"max_loras_per_request ({self.max_loras_per_request}) cannot exceed max_loras "
                f"({self.max_loras}): a request's adapters are resident together"
            )
        return self

    @model_validator(mode="after")
    def _check_groups(self) -> ServerConfig:
        seen: set[str] = set()
        for index, group in enumerate(self.node_groups):
            for node in group.nodes:
                if node in seen:
                    raise ValueError(f"node_groups[{index}]: node '{node}' is placed twice")
                seen.add(node)
        return self

    def placement(self, node_names: tuple[str, ...]) -> list[NodeGroup]:
        """Worker groups covering every node of the model; errors name the bad node."""
        if not self.node_groups:
            return [NodeGroup(device=self.device, nodes=list(node_names))]
        placed = {n for g in self.node_groups for n in g.nodes}
        unknown = placed - set(node_names)
        if unknown:
            raise ValueError(f"node_groups: unknown node(s) {sorted(unknown)}; model has {list(node_names)}")
        missing = [n for n in node_names if n not in placed]
        if missing:
            raise ValueError(f"node_groups: node(s) {missing} are not placed on any worker")
        return self.node_groups


def load_config(path: str | Path | None = None, **overrides: Any) -> ServerConfig:
    """Read the YAML (if any), apply non-None overrides (CLI flags win), validate."""
    import yaml

    data: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: the config must be a mapping of keys to values")
        data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return ServerConfig(**data)
