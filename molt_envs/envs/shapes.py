"""``molt/shapes-v1``: questions about procedurally drawn shapes, answered from the image alone.

Each row is one picture drawn with Pillow (a 64 x 64 canvas cut into a 4 x 4 grid; each shape sits in a cell of its
own, so shapes never overlap) and one question of three kinds:

- count: "How many shapes are there?" (1 to 4 shapes) -> ``"3"``
- colour: "What colour is the shape?" (one shape) -> ``"red"``
- compare: "Are there more circles or squares?" (1 to 3 of each, never as many) -> ``"circles"``

The question never gives the answer away; only the picture does. Row ``i`` of a split is drawn from its own seed,
``split offset + i``, and the train and test offsets are a million apart, so the splits come from disjoint seeds.
The grader is exact match on the model's first line (case, surrounding spaces and a final period ignored).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from typing import Any

from molt_envs.contract import Env, Result, StepState

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (50, 80, 220), "yellow": (235, 200, 30)}
KINDS = ("circle", "square", "triangle")
TASKS = ("count", "colour", "compare")
CANVAS, GRID = 64, 4
SPLIT_OFFSETS = {"train": 0, "test": 1_000_000}
_SPECIAL = re.compile(r"<\|[^|]*\|>|</?s>")


def draw(shapes: list[tuple[str, str, int]], rng: random.Random) -> Any:
    """A white canvas with each ``(kind, colour, cell)`` drawn inside its grid cell, at a random size and offset."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (CANVAS, CANVAS), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    cell = CANVAS // GRID
    for kind, colour, index in shapes:
        size = rng.randint(cell // 2 + 2, cell - 2)
        x = (index % GRID) * cell + rng.randint(0, cell - size)
        y = (index // GRID) * cell + rng.randint(0, cell - size)
        box = (x, y, x + size - 1, y + size - 1)
        fill = COLOURS[colour]
        if kind == "circle":
            pen.ellipse(box, fill=fill)
        elif kind == "square":
            pen.rectangle(box, fill=fill)
        else:
            pen.polygon([(x + size // 2, y), (x, y + size - 1), (x + size - 1, y + size - 1)], fill=fill)
    return image


def make_row(seed: int) -> dict[str, Any]:
    """The row drawn from ``seed``: ``{"question", "answer", "image", "task", "seed"}``."""
    rng = random.Random(seed)
    task = rng.choice(TASKS)
    colours = list(COLOURS)
    if task == "count":
        n = rng.randint(1, 4)
        kinds = [(rng.choice(KINDS), rng.choice(colours)) for _ in range(n)]
        question, answer = "How many shapes are there?", str(n)
    elif task == "colour":
        kind, colour = rng.choice(KINDS), rng.choice(colours)
        kinds = [(kind, colour)]
        question, answer = f"What colour is the {kind}?", colour
    else:
        circles, squares = rng.sample(range(1, 4), 2)
        kinds = [("circle", rng.choice(colours)) for _ in range(circles)]
        kinds += [("square", rng.choice(colours)) for _ in range(squares)]
        question, answer = "Are there more circles or squares?", "circles" if circles > squares else "squares"
    cells = rng.sample(range(GRID * GRID), len(kinds))
    image = draw([(kind, colour, cell) for (kind, colour), cell in zip(kinds, cells, strict=True)], rng)
    return {"question": question, "answer": answer, "image": image, "task": task, "seed": seed}


def generate_split(split: str, size: int = 2000, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Rows of ``split`` ('train' or 'test'): row ``i`` is ``make_row(seed * 10**7 + offset + i)``."""
    return seeded_split("shapes", make_row, split, size, seed)


def seeded_split(
    name: str, make_row: Callable[[int], dict[str, Any]], split: str, size: int, seed: int
) -> Iterator[dict[str, Any]]:
    """The rows of a generated env's ``split``: row ``i`` is ``make_row(seed * 10**7 + offset + i)``, the test
    split's seeds 1,000,000 above the train split's (disjoint for up to 1,000,000 rows).

    Raises:
        ValueError: an unknown ``split`` or a ``size`` outside 1..1,000,000, naming env ``name``.
    """
    if split not in SPLIT_OFFSETS:
        raise ValueError(f"{name} has splits {sorted(SPLIT_OFFSETS)}, not {split!r}")
    if not 0 < size <= 1_000_000:
        raise ValueError(f"a {name} split holds 1 to 1,000,000 rows (its seed range), got size={size}")
    base = seed * 10**7 + SPLIT_OFFSETS[split]
    return (make_row(base + i) for i in range(size))


def normalize(text: str) -> str:
    """The first line of a reply, special tokens dropped, lower-cased, without surrounding spaces or a final period."""
    text = _SPECIAL.sub("\n", text).strip()
    return text.split("\n", 1)[0].strip().rstrip(".").strip().lower() if text else ""


class ShapesEnv(Env):
    """Single turn: the row's image and question; reward 1 for the exact answer."""

    async def step(self, state: StepState) -> Result:
        correct = float(normalize(state["action_text"]) == str(state["label"]).strip().lower())
        return Result(reward=correct, terminated=True, info={"correct": correct})
