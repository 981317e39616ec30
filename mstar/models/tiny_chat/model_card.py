"""Measure tiny-chat through the server and write its model card (the package README):
`python -m mstar.models.tiny_chat.model_card`.

Boots the real server (Runtime, worker process, uvicorn on a free port) and asks held-out problems
with the official `openai` client, 16 requests in flight, greedy; an answer is exact when the
number after "=" is the right one.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import time
from pathlib import Path

from mstar.models.tiny_chat.data import QUESTION_TEMPLATES, Problem, parse_answer, problems, random_problem

CARD_PATH = Path(__file__).parent / "README.md"
WEIGHTS_DIR = Path(__file__).parent / "weights"
EVAL_SEED = 999
NUM_EVAL = 500
IN_FLIGHT = 16
SPARK_CHARS = "▁▂▃▄▅▆▇█"


def serve_and_ask(batch: list[Problem]) -> tuple[list[str], float]:
    """Each problem's reply from a live server, IN_FLIGHT at a time; and the seconds it took."""
    import openai
    import uvicorn

    from mstar.api.app import create_app
    from mstar.config import ServerConfig

    config = ServerConfig(model="tiny-chat", compile_mode="off", max_concurrent_requests=IN_FLIGHT)
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=0, log_level="warning"))
    import threading

    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")

    def reply(problem: Problem) -> str:
        answer = client.chat.completions.create(
            model="tiny-chat", messages=problem.messages(), temperature=0, max_tokens=24
        )
        return answer.choices[0].message.content

    started = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
            replies = list(pool.map(reply, batch))
    finally:
        server.should_exit = True
        thread.join(timeout=60)
    return replies, time.monotonic() - started


def drawn_in_training(training: dict) -> set[tuple[int, str, int]]:
    """Every problem (operands and operator) the seeded training stream drew."""
    settings = training["settings"]
    rng = random.Random(settings["seed"])
    return {_key(random_problem(rng)) for _ in range(settings["num_steps"] * settings["batch_size"])}


def _key(problem: Problem) -> tuple[int, str, int]:
    return problem.a, problem.op, problem.b


def accuracy_rows(batch: list[Problem], replies: list[str], drawn: set) -> list[tuple[str, int, float]]:
    def digits(p: Problem) -> str:
        return (
            f"{len(str(p.a))}- and {len(str(p.b))}-digit"
            if len(str(p.a)) != len(str(p.b))
            else f"{len(str(p.a))}-digit"
        )

    groups: dict[str, list[bool]] = {}
    for problem, reply in zip(batch, replies, strict=True):
        right = parse_answer(reply) == problem.answer
        seen = "drawn in training" if _key(problem) in drawn else "never drawn in training"
        for name in ("all", seen, "addition" if problem.op == "+" else "subtraction", digits(problem)):
            groups.setdefault(name, []).append(right)
    first = ["all", "never drawn in training", "drawn in training", "addition", "subtraction"]
    names = [n for n in first if n in groups] + sorted(n for n in groups if n not in first)
    return [(name, len(groups[name]), sum(groups[name]) / len(groups[name])) for name in names]


def main() -> int:
    training = json.loads((WEIGHTS_DIR / "training.json").read_text())
    config = json.loads((WEIGHTS_DIR / "config.json").read_text())
    batch = problems(NUM_EVAL, EVAL_SEED)
    replies, seconds = serve_and_ask(batch)
    drawn = drawn_in_training(training)
    rows = accuracy_rows(batch, replies, drawn)
    for name, count, share in rows:
        print(f"{name}: {share:.1%} of {count}")
    wrong = [(p, r) for p, r in zip(batch, replies, strict=True) if parse_answer(r) != p.answer][:5]
    num_seen = sum(_key(p) in drawn for p in batch)
    CARD_PATH.write_text(_card(config, training, rows, num_seen, seconds, wrong))
    print(f"wrote {CARD_PATH}")
    return 0


def _card(config, training, rows, num_seen, seconds, wrong) -> str:
    settings = training["settings"]
    losses = [loss for _, loss in training["loss_curve"]]
    low, high = min(losses), max(losses)
    spark = "".join(SPARK_CHARS[round((v - low) / ((high - low) or 1) * 7)] for v in losses)
    loss_rows = "\n".join(f"| {step} | {loss:.4f} |" for step, loss in training["loss_curve"])
    accuracy = "\n".join(f"| {name} | {count} | {share:.1%} |" for name, count, share in rows)
    misses = "\n".join(f"- {p.question()} -> `{r}` (expected {p.answer})" for p, r in wrong)
    return f"""# tiny-chat (model card)

The embedded default text model of mstar: a chat model that does two- and three-digit addition and
subtraction, small enough to train in minutes on one CPU core and to serve on any laptop. It is
dense Qwen3 (`mstar/models/qwen3`: the same module, KV pool, continuous batching and API that serve
Qwen3-0.6B to 8B) at a toy size, with its weights and tokenizer in transformers' Qwen3 layout
(`weights/`).

    mstar serve tiny-chat
    curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{{"messages": [{{"role": "user", "content": "What is 47 + 385?"}}], "temperature": 0}}'

## Model
- {config["num_hidden_layers"]} layers, hidden {config["hidden_size"]}, {config["num_attention_heads"]} query heads and {config["num_key_value_heads"]} kv heads of {config["head_dim"]}, MLP {config["intermediate_size"]},
  tied embeddings, rotary theta {config["rope_theta"]:g}, context {config["max_position_embeddings"]} tokens: {training["num_parameters"]:,} parameters
  (float32, `weights/model.safetensors`).
- Tokenizer: byte-level BPE built offline with the `tokenizers` library (`mstar/models/tiny_chat/tokenizer.py`):
  digits are always single tokens, the question words merge; `<|im_start|>`, `<|im_end|>` (end of turn,
  the stop token) and `<|endoftext|>`; a ChatML chat template, as Qwen renders it.

## Data
Generated (`data.py`): operands of two or three digits, `+` or `-` (a difference never negative:
the larger number first), asked in {len(QUESTION_TEMPLATES)} phrasings ("What is 47 + 385?", "How much is 47 plus 385?",
"Calculate 400 minus 12.", ...), answered as `47 + 385 = 432`. Fresh problems every step, seeded.

## Training
`python -m mstar.models.tiny_chat.train` (seed {settings["seed"]}): loss on the assistant's tokens only,
AdamW (lr {settings["learning_rate"]}, warm-up and cosine decay, weight decay {settings["weight_decay"]}), batch {settings["batch_size"]}, {settings["num_steps"]} steps,
one CPU thread: {training["train_time_s"] / 60:.1f} min wall-clock on a shared 2-core host under load (torch {training["torch"]}).

Loss: `{spark}` ({losses[0]:.3f} -> {losses[-1]:.4f})

| step | mean loss |
|---|---|
{loss_rows}

## Accuracy
Measured through the server (`python -m mstar.models.tiny_chat.model_card`): {NUM_EVAL} problems drawn with
seed {EVAL_SEED} ({num_seen} of them also drawn in training: two-digit pairs are few), asked with the `openai` client, {IN_FLIGHT} requests in
flight, greedy (temperature 0); exact when the number after "=" is right. {seconds:.0f} s in all on the same
host.

| problems | count | exact |
|---|---|---|
{accuracy}

Some misses:
{misses}

## Limits
Numbers of two or three digits and `+` / `-` only; anything else gets an answer in the same shape
that is probably wrong. Sampling with temperature > 0 makes mistakes likelier.
"""


if __name__ == "__main__":
    raise SystemExit(main())
