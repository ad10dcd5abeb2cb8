"""Indexing rows by an id (``rollout_id``, ``group_id``), in first-seen order.

A rollout of a chat agent can be split into several segments (rows) that
share one ``rollout_id`` and one reward; the rollouts of one prompt share a
``group_id``. The seats of one game are separate rollouts (a ``rollout_id``
and a reward each) in separate groups, ``<prompt group>/<seat>``
(``molt_train.experience.estimator_group``). Estimators, loss aggregation, reward shaping and dynamic
filtering all need "which unit does this row belong to", which is this.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor


def index_by(ids: Sequence[Hashable]) -> tuple[Tensor, list[int]]:
    """Map each row to the index of its id, numbering ids in first-seen order.

    Returns ``(unit_of_row, first_rows)``: ``unit_of_row[i]`` (a long tensor of
    shape (N,)) is the unit index of row ``i``, and ``first_rows[u]`` is the
    first row carrying unit ``u``'s id (its representative).
    """
    unit_of: dict[Hashable, int] = {}
    first_rows: list[int] = []
    unit_of_row = []
    for row, unit_id in enumerate(ids):
        if unit_id not in unit_of:
            unit_of[unit_id] = len(first_rows)
            first_rows.append(row)
        unit_of_row.append(unit_of[unit_id])
    return torch.tensor(unit_of_row, dtype=torch.long), first_rows
