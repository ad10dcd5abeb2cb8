"""The unbiased pass@k estimator (Chen et al., 2021) and the list of k an eval reports."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from math import comb

from env_registry.errors import Error


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from ``n`` passes, ``c`` of them
    passing: ``1 - C(n-c, k) / C(n, k)``.

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k holds a pass
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """pass@k averaged over prompts, each given as ``(n, c)``; prompts with fewer than ``k`` samples are skipped."""
    values = [pass_at_k(n, c, k) for n, c in counts if n >= k]
    return sum(values) / len(values) if values else 0.0


def resolve_ks(ks: Sequence[int] | None, n: int) -> list[int]:
    """The k to report: those asked for (each must be ``1 <= k <= n``), or every k from 1 to n.

    Raises:
        Error: a k outside ``[1, n]``, naming it and ``n``.
    """
    if not ks:
        return list(range(1, n + 1))
    for k in ks:
        if not 1 <= k <= n:
            raise Error(
                f"--k {k} is not possible with -n {n}: pass@k needs 1 <= k <= n samples per prompt; "
                f"raise -n to at least {k} or drop k={k}"
            )
    return sorted(set(ks))
