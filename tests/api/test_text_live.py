"""tiny-chat behind the real server (Runtime, worker process, live uvicorn), driven by the official
`openai` client: chat and completions, streaming chunks and usage, logprobs, n, stop strings, a
client that goes away, /v1/models and the vLLM-named metrics, and accuracy with 16 requests in
flight."""

from __future__ import annotations

import concurrent.futures
import logging
import time

import httpx
import openai
import pytest

from mstar.api.app import create_app
from mstar.config import ServerConfig
from mstar.models.tiny_chat.data import problems
from tests.api.live import LiveServer

MODEL = "tiny-chat"
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def server():
    config = ServerConfig(model=MODEL, compile_mode="off", max_concurrent_requests=32)
    with LiveServer(create_app(config)) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def ask(client, question: str, **fields):
    fields.setdefault("temperature", 0)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], **fields
    )


def metric(server, name: str) -> float:
    for line in httpx.get(server.base_url + "/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_chat_answers_with_usage(client):
    reply = ask(client, "What is 47 + 385?")
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == "47 + 385 = 432"
    assert choice.finish_reason == "stop"
    # "4" "7" " +" " " "3" "8" "5" " =" " " "4" "3" "2", then <|im_end|> (counted, not shown)
    assert reply.usage.completion_tokens == 13
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streaming_chunks_and_usage_in_the_last_chunk(client):
    stream = ask(client, "What is 12 + 30?", stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "12 + 30 = 42"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_max_tokens_logprobs_and_n(client):
    reply = ask(client, "What is 400 - 123?", max_tokens=3, logprobs=True, top_logprobs=2, n=2)
    assert len(reply.choices) == 2
    for choice in reply.choices:
        assert choice.finish_reason == "length" and choice.message.content == "400"
        entries = choice.logprobs.content
        assert [e.token for e in entries] == ["4", "0", "0"]
        assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
        assert entries[0].top_logprobs[0].token == "4"
    assert reply.usage.completion_tokens == 6


def test_stop_strings_end_the_text_before_them(client):
    reply = ask(client, "What is 47 + 385?", stop=[" ="])
    assert reply.choices[0].message.content == "47 + 385" and reply.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(client):
    first = ask(client, "What is 11 + 22?", temperature=1.5, seed=5, max_tokens=8)
    again = ask(client, "What is 11 + 22?", temperature=1.5, seed=5, max_tokens=8)
    assert first.choices[0].message.content == again.choices[0].message.content


def test_completions_route(client):
    prompt = "<|im_start|>user\nWhat is 20 + 22?<|im_end|>\n<|im_start|>assistant\n"
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0, logprobs=1)
    choice = reply.choices[0]
    assert choice.text == "20 + 22 = 42" and choice.finish_reason == "stop"
    assert (
        len(choice.logprobs.tokens)
        == len(choice.logprobs.token_logprobs)
        == reply.usage.completion_tokens - 1
    )
    streamed = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == "20 + 22 = 42"


def test_debug_logging_gives_each_requests_stages_in_order(client, caplog):
    """The worker's stages (first piece's timeline, same host clock) fall between the API's."""
    import re

    with caplog.at_level(logging.DEBUG, logger="mstar.api"):
        stream = ask(client, "What is 12 + 30?", stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "12 + 30 = 42"
    (line,) = [r.getMessage() for r in caplog.records if "ms after arrival" in r.getMessage()]
    stages = re.findall(
        r"(submitted|at the node|first step queued|first token read|first piece|done) ([\d.]+)", line
    )
    assert [name for name, _ in stages] == [
        "submitted", "at the node", "first step queued", "first token read", "first piece", "done",
    ]  # fmt: skip
    times = [float(ms) for _, ms in stages]
    assert times == sorted(times), line
    assert re.search(r"\(\d+ prompt tokens, \d+ cached, 11 output\)$", line), line  # 10 tokens and the stop


def test_models_card_gives_the_context_length(server):
    card = httpx.get(server.base_url + "/v1/models").json()["data"][0]
    assert card["id"] == MODEL and card["task"] == "text-generation" and card["max_model_len"] == 256


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": []}, "messages"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10_000}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "1 + 1 " * 200}]}, "messages"),
        ({"n": 0}, "n"),
        ({"n": 1000}, "n"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"stop": ["a"] * 20}, "stop"),
        ({"stop": "x" * 1000}, "stop"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ],
)
def test_bad_chat_input_is_a_400_naming_the_field(server, body, param):
    full = {"model": MODEL, "messages": [{"role": "user", "content": "What is 1 + 1?"}], **body}
    response = httpx.post(server.base_url + "/v1/chat/completions", json=full)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_nan_temperature_and_bad_completions_are_400s(server):
    raw = b'{"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    response = httpx.post(
        server.base_url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "temperature"
    for body, param in (({"prompt": ""}, "prompt"), ({"prompt": "hi", "logprobs": 21}, "logprobs")):
        response = httpx.post(server.base_url + "/v1/completions", json={"model": MODEL, **body})
        assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_a_client_that_goes_away_aborts_and_frees_its_pages(server):
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": "What is 1 + 2?"}], "stream": True,
        "max_tokens": 200, "ignore_eos": True,
    }  # fmt: skip
    aborted_before = metric(server, 'mstar:requests_total{model_name="tiny-chat",outcome="aborted"}')
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        aborted = metric(server, 'mstar:requests_total{model_name="tiny-chat",outcome="aborted"}')
        if aborted > aborted_before and metric(server, "mstar:kv_cache_usage_perc") == 0.0:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the request was not aborted, or its pages were not given back")


def test_accuracy_with_16_requests_in_flight_and_metrics(server, client):
    """The model card's claim, on a fixed set: at least 90% exact answers (greedy) with 16 in flight."""
    from mstar.models.tiny_chat.data import parse_answer

    batch = problems(64, seed=7)

    def correct(problem) -> bool:
        reply = client.chat.completions.create(
            model=MODEL, messages=problem.messages(), temperature=0, max_tokens=24
        )
        return parse_answer(reply.choices[0].message.content) == problem.answer

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(correct, batch))
    assert sum(results) / len(results) >= 0.9
    assert metric(server, "mstar:generation_tokens_total") > 64 * 5
    assert metric(server, "mstar:prompt_tokens_total") > 64 * 10
    assert metric(server, "mstar:time_to_first_token_seconds_count") >= 64
    assert (
        metric(server, "mstar:prefix_cache_queries_total")
        > metric(server, "mstar:prefix_cache_hits_total")
        > 0
    )


def test_llm_bench_client_against_the_server(server):
    """`mstar bench llm`'s load phases: exact output counts, TTFT/TPOT percentiles, a prefix hit."""
    import asyncio

    from mstar.bench.llm import decode_floor, llm_table
    from mstar.bench.llm_load import closed_loop, prefix_ttft, random_prompts, summarize
    from mstar.models.qwen3.config import QWEN3_CONFIGS

    prompts = random_prompts(4, 12, 342, seed=0)
    timings, wall_s = asyncio.run(closed_loop(server.base_url, MODEL, prompts, 6, 2, 60.0))
    level = summarize(timings, wall_s, 2)
    assert level["num_requests"] == 4 and level["output_tokens"] == 24  # EOS ignored: exactly 6 each
    assert level["ttft_ms_p50"] > 0 and level["tpot_ms_p50"] > 0
    prefix = asyncio.run(prefix_ttft(server.base_url, MODEL, 342, 64, 1, 0, 60.0))
    assert prefix["cached_tokens_p50"] == 64  # the shared system prompt's four full pages
    floor = decode_floor(QWEN3_CONFIGS["qwen3-8b"], 640, 4.3e12)
    # 16.4 GB of bf16 weights less the input embedding's 1.2 GB (a token reads one row), 0.1 GB of
    # KV, at 4.3 TB/s
    assert floor["weight_gb"] == 15.137 and 3.5 < floor["floor_ms"] < 3.6
    table = llm_table({"levels": [level], "prefix_cache": prefix, "decode_floor": floor})
    assert "| 2 | 4 |" in table
