"""``MetricsLogger``: a fresh run into an existing output directory replaces the old records; a resumed run
appends, and ``read_metrics`` keeps the last record of a step logged twice."""

from __future__ import annotations

import json

from molt_train.metrics import MetricsLogger, read_metrics


def log_steps(out, steps, start_step=0, value=0.0):
    logger = MetricsLogger(out, total_steps=max(steps), start_step=start_step, progress=False)
    for step in steps:
        logger.log(step, {"loss": value + step, "note": "not a number"})
    logger.close()


def test_a_fresh_run_replaces_an_earlier_runs_records(tmp_path):
    log_steps(tmp_path, [1, 2, 3])
    log_steps(tmp_path, [1, 2])
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    assert all("note" not in r for r in lines)  # only finite numbers are logged


def test_a_resumed_run_appends_and_the_last_record_of_a_step_wins(tmp_path):
    log_steps(tmp_path, [1, 2, 3])
    log_steps(tmp_path, [3, 4], start_step=2, value=10.0)  # killed after step 3's log: step 3 runs again
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]
