"""An episode's one deadline (``--rollout.timeout_s``): what the rollout worker wraps every episode in."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

CLEANUP_GRACE_S = 30.0  # how long an episode cancelled at its deadline gets to release what it holds


async def within_deadline(episode: Awaitable[Any], timeout_s: float, cleanup_grace_s: float = CLEANUP_GRACE_S) -> Any:
    """``episode``'s result if it ends within ``timeout_s`` (``--rollout.timeout_s``): the one deadline of everything
    done on its behalf. At the deadline the episode is cancelled; its ``finally`` and ``async with`` blocks release
    what it holds (a persistent sandbox session's jail is killed and its slot freed, the env closed, temp dirs
    removed, harness processes killed), for up to ``cleanup_grace_s`` more, and TimeoutError is raised, even when the
    episode swallowed the cancellation and returned. A cleanup still running after the grace goes on in the
    background (logged) rather than holding up the batch. Cancelling the caller cancels the episode the same way.

    Raises:
        TimeoutError: the episode ran past its deadline.
    """
    task = asyncio.ensure_future(episode)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.wait({task}, timeout=cleanup_grace_s)
        raise
    if done:
        return task.result()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=cleanup_grace_s)
    if not done:
        logging.getLogger(__name__).warning(
            "an episode cancelled at its %g s deadline is still cleaning up after %g s more", timeout_s, cleanup_grace_s
        )
    task.add_done_callback(_retrieve)  # a late result or failure is still a timeout; never "never retrieved"
    raise TimeoutError(f"the episode ran past its {timeout_s:g} s deadline")


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
