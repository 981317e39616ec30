"""One validated schema for the YAML config and the CLI flags; echoed at start."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

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
    model_config = ConfigDict(extra="forbid")

    model: str = "tiny-digits"
    model_path: str | None = None
    random_weights: bool = False
    device: str = "cpu"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: str | None = None
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    # Host names the Host header may carry besides the loopback ones and public_url's (requests with
    # others get a 400: DNS rebinding). "*" accepts any; with none, a server bound to loopback accepts
    # only loopback names and one bound elsewhere accepts any. Origin headers of state-changing
    # requests must match the Host header or name one of these (else 403: cross-site requests).
    allowed_hosts: list[str] = []
    # Where clients reach the server ("https://api.example.com"): the base of response_format=url
    # media links. None: the address the request came in on (never the client's Host header).
    public_url: str | None = None
    # Connections, as a front-facing server bounds them (mstar/api/connections.py): at most
    # max_connections open (more are answered 503 and closed; under the usual 1024-descriptor limit,
    # with room for the runtime's sockets and files); closed after idle_timeout_s without a request
    # (before the first one and between requests); 408 and closed when the headers take over
    # header_timeout_s from the request's first byte, or the body over body_timeout_s after them.
    max_connections: int = Field(512, ge=1)
    idle_timeout_s: float = Field(5.0, gt=0)
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)
    # SIGTERM or SIGINT: the server stops accepting, requests in flight get this long to finish (then
    # a 503), the workers are stopped and the process exits 0 (uvicorn's timeout_graceful_shutdown).
    shutdown_grace_s: float = Field(30.0, ge=0)

    # Placement: empty means one worker holding every node on `device`.
    node_groups: list[NodeGroup] = []
    transport: Literal["ipc", "tcp"] = "ipc"

    max_concurrent_requests: int = Field(16, ge=1)
    max_queue_size: int = Field(64, ge=0)
    request_timeout_s: float = Field(1800.0, gt=0)
    job_ttl_s: float = Field(3600.0, gt=0)
    worker_restart: bool = True
    # Workers heartbeat every heartbeat_interval_s. One that missed two is stalled (SIGSTOPped, hung
    # in native code): /ready turns 503 and new requests get 503 with Retry-After until it beats
    # again; one silent for heartbeat_timeout_s is killed (its requests fail) and restarted.
    heartbeat_interval_s: float = Field(1.0, gt=0)
    heartbeat_timeout_s: float = Field(30.0, gt=0)

    attention_backend: Literal["auto", "fa3", "flashinfer", "torch"] = "auto"
    flashinfer_backend: Literal["auto", "fa2", "fa3", "cudnn", "cutlass"] = "auto"
    workspace_mb: int = Field(512, ge=1)

    compile_mode: Literal["deterministic", "default", "max-autotune", "off"] = "deterministic"
    compile_sizes: list[CompileSize] = []
    # where compiled kernels are kept across restarts (inductor's graph cache, Triton's binaries);
    # None: torch's default under /tmp. A warm cache cut Wan's boot from 161 s to 48 s on the H200.
    compile_cache_dir: str | None = None
    # launch-bound parts replay CUDA graphs captured at warmup (Z-Image's prompt encoder); CUDA only
    cuda_graphs: bool = True
    warmup: bool = True
    # DiT q/k/v (and Z-Image gate/up) projections concatenated into one GEMM each after loading;
    # CUDA only (the CPU path stays the plain reference). False to A/B it or rule it out.
    fuse_projections: bool = True
    # hand-written Triton kernels where inductor's are slow (mstar/engine/kernels: the DiTs' q/k RMS
    # norm + rotary, both DiTs' residual updates + next norms); CUDA with fuse_projections and Triton
    # installed (without Triton: one warning, the PyTorch code). On the H200, served at c=1: Z-Image
    # 1024x1024 88.6 against 91.5 ms a step, 512x512 23.3 against 24.5; Wan's 480p guidance pair
    # 119.0 against 121.4 (q/k kernel only; 123.7 without any in the step profile). False to A/B.
    triton_kernels: bool = True
    max_tokens_per_step: int = Field(131072, ge=1)
    max_batch_size: int = Field(8, ge=1)
    # prompt embeddings kept on the text encoder's device for texts that come back (0: off)
    prompt_cache_mb: int = Field(64, ge=0)
    # the text encoder's weights stay in host memory and stream to the GPU block by block for each
    # prompt: Wan's UMT5-XXL holds ~0.7 GiB on the GPU instead of ~8.6, and a prompt pays the
    # weights' trip over PCIe (H200: 132 ms per prompt against 31 ms resident). Wan2.2 only (other
    # models refuse it at boot; a text encoder placed on the CPU has nothing to offload).
    offload_text_encoder: bool = False
    # a clip's frames go from the VAE to the MP4 muxer chunk by chunk as they decode, so the encode
    # overlaps the decode (False: the clip is muxed whole once decoded; to A/B)
    stream_video_frames: bool = True

    # Text models (LLM serving): the paged KV pool, sized at boot from the memory left after the
    # weights and the workspace (kv_pool_pages pages when set, else kv_cache_memory_fraction of it),
    # and continuous batching (at most max_num_seqs sequences and max_num_batched_tokens tokens a
    # step; max_model_len None: the model's context length). Decode steps replay CUDA graphs of
    # up to max_num_seqs rows when cuda_graphs is on. FlashInfer builds its kernels at boot, under
    # compile_cache_dir/flashinfer when that is set.
    kv_page_tokens: int = Field(16, ge=1, le=1024)
    kv_cache_memory_fraction: float = Field(0.85, gt=0, le=1)
    kv_pool_pages: int | None = Field(None, ge=1)
    kv_attention_backend: Literal["auto", "flashinfer", "fa3", "torch"] = "auto"
    enable_prefix_caching: bool = True
    max_num_seqs: int = Field(128, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    max_model_len: int | None = Field(None, ge=2)

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
