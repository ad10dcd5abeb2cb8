"""Final-answer extraction and numeric comparison for math word problems.

Extraction order: the last balanced ``\\boxed{...}``, then a GSM8K-style ``#### answer`` line, then the last number
in the text. Comparison is numeric (commas, ``$``, ``%`` and simple fractions are understood), so ``\\boxed{1,000}``
matches ``1000`` and ``\\boxed{0.5}`` matches ``1/2``.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_HASHES = re.compile(r"####\s*([^\n]+)")


def last_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` (or ``\\fbox{...}``), or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def extract_answer(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    hashes = _HASHES.findall(text)
    if hashes:
        return hashes[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def to_number(answer: str) -> Fraction | None:
    """Parse the number an answer states (``$1,234.50``, ``50%``, ``3/4``, ``\\frac{3}{4}``), or None."""
    text = answer.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "").replace("\\!", "")
    frac = re.fullmatch(r"\s*(-?)\\d?frac\{(\d+)\}\{(\d+)\}\s*", text)
    if frac:
        sign, num, den = frac.groups()
        return Fraction(int(num), int(den)) * (-1 if sign else 1) if int(den) else None
    found = _NUMBER.findall(text)
    if len(found) != 1:
        return None
    token = found[0].replace(",", "")
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def grade(response: str, label: str) -> dict[str, float]:
    """Return ``{"reward", "math_exact", "missing_answer"}`` for a response against a label (number or GSM8K answer)."""
    predicted = extract_answer(response)
    if predicted is None:
        return {"reward": 0.0, "math_exact": 0.0, "missing_answer": 1.0}
    expected = extract_answer(str(label)) if "####" in str(label) or "\\boxed" in str(label) else str(label)
    a, b = to_number(predicted), to_number(expected or "")
    exact = float(a is not None and a == b) if b is not None else float(predicted.strip() == str(expected).strip())
    return {"reward": exact, "math_exact": exact, "missing_answer": 0.0}
