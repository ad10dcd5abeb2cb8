"""``molt-env``: list, inspect and check registered environments."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence

from env_registry.conformance import check
from env_registry.datasets import count_rows
from env_registry.errors import Error
from env_registry.registry import pprint_registry, registry


def cmd_list(args: argparse.Namespace) -> int:
    pprint_registry()
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    spec = registry.spec(args.env_id)
    splits = {}
    for split, cfg in spec.datasets.items():
        try:
            rows: int | str = count_rows(spec, split)
        except Error as exc:
            rows = f"unavailable ({exc})"
        splits[split] = {"source": cfg.path or cfg.generator, "rows": rows}
    info = {"id": spec.id, "hash": spec.hash, "package": spec.package, "package_version": spec.package_version,
            "spec": spec.model_dump(mode="json"), "datasets": splits,
            "tools": [t.model_dump() for t in spec.tools]}
    print(json.dumps(info, indent=2))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    report = check(args.target)
    print(report.render())
    return 0 if report.passed else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="molt-env", description="Versioned LLM-agent environments.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every registered ID, grouped by namespace").set_defaults(fn=cmd_list)
    info = sub.add_parser("info", help="spec, manifest, datasets and tools of one env")
    info.add_argument("env_id")
    info.set_defaults(fn=cmd_info)
    chk = sub.add_parser("check", help="conformance check; exit 1 with a report on failure")
    chk.add_argument("target", help="an env ID, or a package source directory")
    chk.set_defaults(fn=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.simplefilter("default")
    try:
        return args.fn(args)
    except Error as exc:
        print(f"molt-env {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
