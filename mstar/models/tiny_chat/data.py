"""Generated chat data for tiny-chat: two- and three-digit addition and subtraction, asked in a few
phrasings, answered as "47 + 385 = 432" (differences are never negative: the larger number comes
first). Seeded: the same seed gives the same problems."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

QUESTION_TEMPLATES = (
    "What is {a} {op} {b}?",
    "{a} {op} {b} = ?",
    "Compute {a} {op} {b}.",
    "How much is {a} {word} {b}?",
    "Calculate {a} {word} {b}.",
    "What's {a} {op} {b}?",
    "Please work out {a} {op} {b}.",
    "{a} {word} {b}?",
)
OPERATORS = {"+": ("plus", lambda a, b: a + b), "-": ("minus", lambda a, b: a - b)}
ANSWER_PATTERN = re.compile(r"=\s*(-?\d+)")
MIN_OPERAND, MAX_OPERAND = 10, 999  # two and three digits


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int
    template: int

    @property
    def answer(self) -> int:
        return OPERATORS[self.op][1](self.a, self.b)

    def question(self) -> str:
        word = OPERATORS[self.op][0]
        return QUESTION_TEMPLATES[self.template].format(a=self.a, b=self.b, op=self.op, word=word)

    def reply(self) -> str:
        return f"{self.a} {self.op} {self.b} = {self.answer}"

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.question()}]


def random_problem(rng: random.Random) -> Problem:
    # half two-digit, half three-digit operands, each drawn on its own
    def operand() -> int:
        return rng.randint(10, 99) if rng.random() < 0.5 else rng.randint(100, MAX_OPERAND)

    a, b, op = operand(), operand(), rng.choice("+-")
    if op == "-" and a < b:  # differences stay non-negative
        a, b = b, a
    return Problem(a, op, b, rng.randrange(len(QUESTION_TEMPLATES)))


def problems(count: int, seed: int) -> list[Problem]:
    rng = random.Random(seed)
    return [random_problem(rng) for _ in range(count)]


def parse_answer(reply: str) -> int | None:
    """The number after "=" in a reply, or None."""
    match = ANSWER_PATTERN.search(reply)
    return int(match.group(1)) if match else None
