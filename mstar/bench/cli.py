"""`mstar bench serve | serve-suite | step | diffusers | parity | report | table`: every claim is a
number measured side by side.

Each benchmark writes a JSON result (with date, GPU, versions, command) and a markdown table next
to it, and prints the table. `report` writes docs/benchmarks.md's per-model tables from the
result files of one run (bench/h200.sh's phases).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

POLL_INTERVAL_HELP = (
    "videos: seconds between status polls; 0 follows the server's openai-poll-after-ms hint at each "
    "poll, as mstar.client does"
)


def _e2e_workloads() -> dict[str, Any]:
    """name -> EndToEndWorkload, over every registered family's bench entry."""
    from mstar.bench.baseline import e2e_workloads

    return {name: workload for name, (_, workload) in e2e_workloads().items()}


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _float_list(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def _str_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _add_output(parser: argparse.ArgumentParser, default_name: str) -> None:
    parser.add_argument(
        "-o", "--output", default=f"bench-results/{default_name}.json", help="JSON result path"
    )


def _serve_parser(sub: Any) -> None:
    e2e_workloads = _e2e_workloads()

    parser = sub.add_parser("serve", help="closed- and open-loop load against an OpenAI-shaped server")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument(
        "--workload", choices=sorted(e2e_workloads), help="fills kind, size, frames, steps, guidance"
    )
    parser.add_argument("--kind", choices=["image", "video"])
    parser.add_argument("--model", help="the `model` field sent (default: none)")
    parser.add_argument("--size", help="WxH")
    parser.add_argument("--seconds", help="videos: the OpenAI `seconds` field")
    parser.add_argument("--steps", type=int, dest="num_inference_steps")
    parser.add_argument("--guidance-scale", type=float)
    parser.add_argument("--extra-body", default="{}", help="JSON merged into every request body")
    parser.add_argument("--concurrency", type=_int_list, default=[1], help="closed loop, e.g. 1,2,4,8")
    parser.add_argument(
        "--request-rate", type=_float_list, default=[], help="open loop, requests/s, e.g. 0.5,1"
    )
    parser.add_argument("--num-requests", type=int, default=16, help="per concurrency level or rate")
    parser.add_argument("--num-warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--request-timeout", type=float, default=600.0, dest="request_timeout_s")
    parser.add_argument(
        "--poll-interval", type=float, default=0.25, dest="poll_interval_s", help=POLL_INTERVAL_HELP
    )
    parser.add_argument("--api-key")
    parser.add_argument("--video-form", action="store_true", help="POST /v1/videos as multipart form")
    _add_output(parser, "serve")


def _suite_parser(sub: Any) -> None:
    e2e_workloads = _e2e_workloads()

    parser = sub.add_parser(
        "serve-suite",
        help="our server's profile: cold vs steady, c=1 vs high c, a new size, mixed sizes, recompiles, parity",
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument(
        "--workload",
        help=f"the result's name; one of {sorted(e2e_workloads)} fills kind, size, steps, guidance",
    )
    parser.add_argument("--kind", choices=["image", "video"])
    parser.add_argument("--model", help="the `model` field sent (default: none)")
    parser.add_argument("--size", help="WxH of every request but the mixed run's (default: first of --sizes)")
    parser.add_argument("--sizes", type=_str_list, default=[], help="the mixed run's sizes, interleaved")
    parser.add_argument("--company-sizes", type=_str_list, default=[], help="parity: sizes in flight")
    parser.add_argument("--steps", type=int, dest="num_inference_steps")
    parser.add_argument("--guidance-scale", type=float)
    parser.add_argument("--extra-body", default="{}", help="JSON merged into every request body")
    parser.add_argument("--num-steady", type=int, default=3, help="c=1 requests after the cold one")
    parser.add_argument("--high-concurrency", type=int, default=4)
    parser.add_argument("--num-high", type=int, default=4)
    parser.add_argument("--num-mixed", type=int, default=8, help="0: no mixed run")
    parser.add_argument("--boot-s", type=float, help="time to /ready, measured by the caller")
    parser.add_argument(
        "--new-size", help="WxH the server did not compile at warmup: first request vs steady"
    )
    parser.add_argument(
        "--new-size-settle", type=float, default=60.0, dest="new_size_settle_s",
        help="seconds between the new size's first request and its steady ones (its background compile)",
    )  # fmt: skip
    parser.add_argument("--max-duration", type=float, default=1e9, dest="max_duration_s", help="time guard")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--request-timeout", type=float, default=600.0, dest="request_timeout_s")
    parser.add_argument(
        "--poll-interval", type=float, default=0.25, dest="poll_interval_s", help=POLL_INTERVAL_HELP
    )
    parser.add_argument("--api-key")
    _add_output(parser, "serve-suite")


def _llm_parser(sub: Any) -> None:
    parser = sub.add_parser("llm", help="LLM serving (random weights) against transformers' generate")
    parser.add_argument(
        "--model",
        default="qwen3-0.6b",
        help="a registered text model with a bench entry (qwen3-0.6b ... qwen3-8b)",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--concurrency", type=_int_list, default=[1, 8, 32, 128])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--system-prompt-tokens", type=int, default=2048, help="the prefix-cache phase")
    parser.add_argument("--num-prefix-pairs", type=int, default=5)
    parser.add_argument("--base-url", help="a running server (default: boot one in this process)")
    parser.add_argument(
        "--kv-attention-backend", default="auto", choices=["auto", "flashinfer", "fa3", "torch"]
    )
    parser.add_argument("--no-cuda-graphs", action="store_false", dest="cuda_graphs")
    parser.add_argument("--compile-cache-dir", help="where FlashInfer's JIT builds are kept")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--server-log", help="where the local server's log goes (default: stderr)")
    parser.add_argument("--seed", type=int, default=0)
    _add_output(parser, "llm")


def _table_parser(sub: Any) -> None:
    parser = sub.add_parser("table", help="print a compact table of result JSON files (partial ones too)")
    parser.add_argument("results", nargs="+", type=Path, help="result JSON files or folders")


def _step_parser(sub: Any) -> None:
    from mstar.bench.baseline import step_workloads

    known_steps = step_workloads()
    parser = sub.add_parser("step", help="DiT ms per step: ours vs diffusers, same weights and shapes")
    names = ",".join(n for n in known_steps if not n.startswith("tiny"))
    parser.add_argument(
        "--workloads", type=_str_list, default=_str_list(names), help=f"from {list(known_steps)}"
    )
    parser.add_argument("--compile-modes", type=_str_list, default=["off", "deterministic"])
    parser.add_argument("--attention-backends", type=_str_list, default=["auto"])
    parser.add_argument("--diffusers-modes", type=_str_list, default=["eager"], help="eager,compiled")
    parser.add_argument("--num-warmup", type=int, default=3)
    parser.add_argument("--num-timed", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="tiny configs for every workload (tiny-* workloads take them anyway)",
    )
    parser.add_argument("--skip-ours", action="store_true")
    parser.add_argument("--skip-diffusers", action="store_true", help="ours alone (seeded init, no parity)")
    _add_output(parser, "step")


def _diffusers_parser(sub: Any) -> None:
    e2e_workloads = _e2e_workloads()

    parser = sub.add_parser("diffusers", help="diffusers pipelines end to end, eager and compiled")
    parser.add_argument(
        "--workloads",
        type=_str_list,
        default=["wan-480p-t2v", "zimage-1024"],
        help=f"from {list(e2e_workloads)}",
    )
    parser.add_argument(
        "--modes", type=_str_list, default=["eager", "compiled"], help="eager, compiled, regional"
    )
    parser.add_argument("--num-warmup", type=int, default=1)
    parser.add_argument("--num-timed", type=int, default=3)
    parser.add_argument(
        "--steps", type=int, dest="num_inference_steps", help="override every workload's steps"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    _add_output(parser, "diffusers")


def _parity_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "parity", help="our nodes vs the reference pipeline on one folder it wrote (random weights)"
    )
    parser.add_argument(
        "model", help="a registered model with a parity hook (wan2.2-ti2v-5b, cosmos3-nano, ...)"
    )
    parser.add_argument("--variant", help="wan2.2-ti2v-5b: t2v (default), i2v, or t2v,i2v (one folder)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny configs (CPU tests)")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    parser.add_argument(
        "--compile-mode", default="off", choices=["off", "deterministic", "default", "max-autotune"]
    )
    parser.add_argument(
        "--steps", type=int, dest="num_inference_steps", help="the default case's steps (model default)"
    )
    parser.add_argument("--folder", help="the reference is written to a new folder in it (default: temp dir)")
    parser.add_argument("--keep-folder", action="store_true")
    _add_output(parser, "parity")


def _report_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "report", help="write docs/benchmarks.md's per-model tables from the phases' result JSON files"
    )
    parser.add_argument("results", nargs="+", type=Path, help="result JSON files or folders")
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mstar bench", description=__doc__)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    parsers = (_serve_parser, _suite_parser, _step_parser, _diffusers_parser, _parity_parser, _llm_parser)
    for add in (*parsers, _report_parser, _table_parser):
        add(sub)
    return parser


def _serve_options(args: argparse.Namespace):
    from mstar.bench.serve import ServeOptions

    e2e_workloads = _e2e_workloads()

    extra_body = json.loads(args.extra_body)
    if not isinstance(extra_body, dict):
        raise SystemExit("--extra-body must be a JSON object")
    kind, size = args.kind, args.size
    if args.workload in e2e_workloads:
        workload = e2e_workloads[args.workload]
        kind = kind or workload.kind
        size = size or f"{workload.width}x{workload.height}"
        fields = workload.request_fields()
        args.num_inference_steps = args.num_inference_steps or fields.pop("num_inference_steps")
        guidance = fields.pop("guidance_scale")
        args.guidance_scale = guidance if args.guidance_scale is None else args.guidance_scale
        extra_body = fields | extra_body
    fields = (
        "model",
        "seconds",
        "num_inference_steps",
        "guidance_scale",
        "seed",
        "num_requests",
        "num_warmup",
    )
    fields += ("request_timeout_s", "poll_interval_s", "api_key")
    sizes = tuple(getattr(args, "sizes", ()))
    return ServeOptions(
        base_url=args.base_url,
        kind=kind or "image",
        size=size if args.size or not sizes else sizes[0],
        sizes=sizes,
        extra_body=extra_body,
        video_form=getattr(args, "video_form", False),
        **{f: getattr(args, f, None) for f in fields},
    )


def _suite_options(args: argparse.Namespace):
    from mstar.bench.serve_suite import SuiteOptions

    args.num_requests, args.num_warmup = 0, 0  # the suite sets its own counts per phase
    serve = _serve_options(args)
    names = ("num_steady", "high_concurrency", "num_high", "num_mixed", "company_sizes", "boot_s")
    names += ("new_size", "new_size_settle_s")
    return SuiteOptions(
        serve=serve, max_duration_s=args.max_duration_s, **{n: getattr(args, n) for n in names}
    )


def _run(args: argparse.Namespace, argv: list[str], write: Any) -> dict[str, Any]:
    if args.benchmark == "serve-suite":
        from mstar.bench.serve_suite import run_serve_suite

        return run_serve_suite(_suite_options(args), on_update=write) | {"workload": args.workload}
    if args.benchmark == "serve":
        from mstar.bench.serve import run_serve_benchmark

        result = run_serve_benchmark(_serve_options(args), args.concurrency, args.request_rate)
        result["workload"] = args.workload
        return result
    if args.benchmark == "llm":
        from mstar.bench.llm import LLMOptions, run_llm_benchmark

        names = ("model", "device", "concurrency", "prompt_tokens", "output_tokens", "system_prompt_tokens")
        names += ("num_prefix_pairs", "base_url", "kv_attention_backend", "cuda_graphs", "compile_cache_dir")
        names += ("skip_baseline", "server_log", "seed")
        return run_llm_benchmark(LLMOptions(**{n: getattr(args, n) for n in names}))
    if args.benchmark == "step":
        from mstar.bench.step import StepOptions, run_step_benchmark

        names = (
            "workloads",
            "compile_modes",
            "attention_backends",
            "diffusers_modes",
            "num_warmup",
            "num_timed",
        )
        names += ("device", "dtype", "seed", "tiny", "skip_ours", "skip_diffusers")
        return run_step_benchmark(StepOptions(**{n: getattr(args, n) for n in names}))
    if args.benchmark == "parity":
        from mstar.bench.parity import ParityOptions, run_parity

        names = ("model", "variant", "device", "tiny", "seed", "compile_mode", "num_inference_steps")
        names += ("folder", "keep_folder")
        return run_parity(ParityOptions(**{n: getattr(args, n) for n in names}))
    from mstar.bench.pipelines import PipelineOptions, run_pipeline_benchmark

    names = ("workloads", "modes", "num_warmup", "num_timed", "num_inference_steps", "device", "seed")
    return run_pipeline_benchmark(PipelineOptions(**{n: getattr(args, n) for n in names}))


def _report(args: argparse.Namespace) -> int:
    from mstar.bench.report import load_results
    from mstar.bench.results_page import update_results_page

    results = load_results(args.results)
    if not results:
        print(f"no benchmark results found in {[str(p) for p in args.results]}", file=sys.stderr)
        return 1
    update_results_page(args.doc, results)
    print(f"{args.doc}: tables written from {len(results)} result file(s)")
    return 0


def _table(args: argparse.Namespace) -> int:
    from mstar.bench.report import compact_table, load_results

    results = load_results(args.results)
    print(compact_table(results) if results else f"no results in {[str(p) for p in args.results]}")
    return 0 if results else 1


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.benchmark in ("report", "table"):
        return _report(args) if args.benchmark == "report" else _table(args)
    from mstar.bench.env import env_info
    from mstar.bench.report import result_markdown

    env = env_info(argv, with_cuda=not args.benchmark.startswith("serve"))
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)

    def write(result: dict[str, Any]) -> None:  # also after every phase of a suite: a killed run keeps them
        partial = result | {"workload": getattr(args, "workload", None), "env": env}
        output.write_text(json.dumps(partial, indent=2, default=str))

    result = _run(args, argv, write)
    result["env"] = env
    output.write_text(json.dumps(result, indent=2, default=str))
    markdown = result_markdown(result)
    output.with_suffix(".md").write_text(markdown)
    print(markdown)
    print(f"wrote {output} and {output.with_suffix('.md')}")
    return 1 if result.get("limits_exceeded") else 0  # parity rows over their limits


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
