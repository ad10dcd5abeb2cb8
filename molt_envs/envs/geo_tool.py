"""``molt/geo-tool-v1``: geo3k-style geometry from a figure, multi-turn, with a sandboxed ``python_executor`` tool.

Each row is a synthetic figure drawn with Pillow whose numbers appear only in the figure (labels on sides and
angles), and a question about it:

- hypotenuse: a right triangle with its legs labelled (a scaled Pythagorean triple) -> the hypotenuse
- angle: a triangle with two angles labelled in degrees -> the third angle
- area: a rectangle with its sides labelled -> its area

The model reads the labels, may call ``python_executor`` (its output comes back as a ``tool`` message rendered by
the model's chat template), and ends with ``\\boxed{answer}`` (or geo3k's ``<answer>answer</answer>``); only that
final answer is graded, numerically. Row ``i`` of a split is drawn from seed ``split offset + i`` (train and test
offsets a million apart: disjoint seeds). ``molt/chat-geo-tool-v1`` is the same task as a ChatAgent.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator
from typing import Any

from molt_envs.contract import Result, StepState
from molt_envs.envs.python_tool import PythonToolEnv
from molt_envs.envs.shapes import seeded_split

SYSTEM_PROMPT = (
    "Answer the geometry question from the figure: read the lengths and angles labelled in it. You may call the "
    "python_executor tool to compute. Give the final answer as \\boxed{number}."
)
TRIPLES = ((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (20, 21, 29), (9, 40, 41))
SIZE = 192
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # a Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _label(pen: Any, xy: tuple[float, float], text: str) -> None:
    pen.text(xy, text, fill=(200, 20, 20), font=_font(18), anchor="mm")


def _right_triangle(rng: random.Random) -> tuple[Any, str, str]:
    from PIL import Image, ImageDraw

    a, b, c = rng.choice(TRIPLES)
    k = rng.randint(1, 4)
    if rng.random() < 0.5:
        a, b = b, a
    image = Image.new("RGB", (SIZE, SIZE), "white")
    pen = ImageDraw.Draw(image)
    scale = 130 / max(a, b)
    ox, oy = 30, 160  # the right angle
    px, py = ox + a * scale, oy - b * scale
    pen.line([(ox, oy), (px, oy), (ox, py), (ox, oy)], fill="black", width=2)
    pen.rectangle((ox, oy - 10, ox + 10, oy), outline="black")
    _label(pen, ((ox + px) / 2, oy + 14), str(a * k))
    _label(pen, (ox - 16, (oy + py) / 2), str(b * k))
    _label(pen, ((ox + px) / 2 + 14, (oy + py) / 2 - 8), "?")
    return image, "In the right triangle shown, what is the length of the side marked '?'", str(c * k)


def _angles(rng: random.Random) -> tuple[Any, str, str]:
    from PIL import Image, ImageDraw

    a = rng.randint(25, 95)
    b = rng.randint(25, 150 - a)
    image = Image.new("RGB", (SIZE, SIZE), "white")
    pen = ImageDraw.Draw(image)
    # vertices A (left), B (right) on a base line, C from the two base angles
    ax, ay, bx = 20.0, 165.0, 172.0
    ta, tb = math.tan(math.radians(a)), math.tan(math.radians(b))
    cx = (ta * ax + tb * bx) / (ta + tb)
    cy = ay - ta * (cx - ax)
    pen.polygon([(ax, ay), (bx, ay), (cx, max(cy, 8))], outline="black", width=2)
    _label(pen, (ax + 28, ay - 10), f"{a}°")
    _label(pen, (bx - 28, ay - 10), f"{b}°")
    _label(pen, (cx, max(cy, 8) + 22), "x")
    return image, "What is the measure of the angle marked x, in degrees?", str(180 - a - b)


def _rectangle(rng: random.Random) -> tuple[Any, str, str]:
    from PIL import Image, ImageDraw

    w, h = rng.randint(11, 99), rng.randint(11, 99)
    image = Image.new("RGB", (SIZE, SIZE), "white")
    pen = ImageDraw.Draw(image)
    scale = 130 / max(w, h)
    x0, y0 = 35, 30
    x1, y1 = x0 + w * scale, y0 + h * scale
    pen.rectangle((x0, y0, x1, y1), outline="black", width=2)
    _label(pen, ((x0 + x1) / 2, y1 + 14), str(w))
    _label(pen, (x0 - 18, (y0 + y1) / 2), str(h))
    return image, "What is the area of the rectangle?", str(w * h)


FIGURES = (_right_triangle, _angles, _rectangle)


def make_row(seed: int) -> dict[str, Any]:
    """The row drawn from ``seed``: ``{"question", "answer", "image", "reference", "seed"}``."""
    rng = random.Random(seed)
    image, question, answer = rng.choice(FIGURES)(rng)
    return {"question": question, "answer": answer, "image": image, "reference": f"\\boxed{{{answer}}}", "seed": seed}


def generate_split(split: str, size: int = 1000, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Rows of ``split`` ('train' or 'test'): row ``i`` is ``make_row(seed * 10**7 + offset + i)``."""
    return seeded_split("geo-tool", make_row, split, size, seed)


def boxed(text: str) -> str:
    """geo3k's ``<answer>X</answer>`` as ``\\boxed{X}`` (what the grader reads); other text as is."""
    return _ANSWER_TAG.sub(lambda m: f"\\boxed{{{m.group(1).strip()}}}", text)


class GeoToolEnv(PythonToolEnv):
    """The python-tool loop over a figure: the row's image is placed in the first user turn by the runner."""

    system_prompt = SYSTEM_PROMPT

    async def step(self, state: StepState) -> Result:
        return await super().step({**state, "action_text": boxed(state["action_text"])})
