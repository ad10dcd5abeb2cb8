"""The publish gate's commands: ``molt-env validate`` (a package checked in the jail, with its calibration) and
``molt-env calibrate`` (the same reference eval of another ecosystem's installed ID, for its hub card)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

from env_registry.errors import Error
from env_registry.validation.calibration import add_reference_flags, check_reference_flags, reference_policy

Flags = Callable[[argparse.ArgumentParser], None]


def add_parsers(sub: Any, registry_args: Flags, db_arg: Flags) -> None:
    """``validate`` and ``calibrate`` under ``molt-env``'s subparsers (``registry_args``/``db_arg``: its shared
    ``--registry --token`` and ``--db`` flags)."""
    val = sub.add_parser(
        "validate",
        help="install a package into a fresh venv and check it inside the sandbox jail; exit 1 if unsound",
    )
    val.add_argument("target", help="a package source directory, a .whl file, or an env ID (ns/name-vN[@version])")
    registry_args(val)
    val.add_argument("--timeout", type=float, default=600.0, help="wall-clock limit of the jailed checks (s)")
    val.add_argument("--json", action="store_true", help="print the report as JSON")
    add_reference_flags(val)
    val.set_defaults(fn=cmd_validate)
    cal = sub.add_parser(
        "calibrate",
        help="the reference eval of another ecosystem's ID (rg:products, ...), stored for its hub card",
        description="Play an installed foreign ID (SCHEME:NAME) with a reference policy, as the publish gate plays a "
        "published env, and store its difficulty figures in the registry: the hub's /envs/SCHEME:NAME card shows them. "
        "The env runs in an env server of its own process, as foreign IDs always do.",
    )
    cal.add_argument("env_id", metavar="ID", help="another ecosystem's ID, e.g. rg:products")
    cal.add_argument("--root", default=os.environ.get("MOLT_REGISTRY", "~/.molt/registry"))
    db_arg(cal)
    add_reference_flags(cal)
    cal.set_defaults(fn=cmd_calibrate)


def cmd_validate(args: argparse.Namespace) -> int:
    """A package (source tree, wheel or published ID) installed into a fresh venv and checked in the jail."""
    from env_registry.validation import validate

    with reference_policy(args) as reference:
        report = validate(
            args.target, registry=args.registry, token=args.token, timeout_s=args.timeout, reference=reference
        )
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render())
    return 0 if report.ok else 1


def cmd_calibrate(args: argparse.Namespace) -> int:
    """The reference eval of another ecosystem's ID, stored in the registry for its hub card."""
    from env_registry.store.local import LocalRegistry
    from env_registry.validation.foreign import calibrate, check_foreign

    if not args.reference_endpoint and not args.reference_checkpoint:
        raise Error("calibrate needs a reference policy: --reference-endpoint URL or --reference-checkpoint PATH")
    check_foreign(args.env_id)
    stamp = check_reference_flags(args)  # before the registry is opened (or made)
    store = LocalRegistry(args.root, db=args.db)
    try:
        with reference_policy(args, stamp) as reference:
            assert reference is not None
            figures = calibrate(store, args.env_id, reference)
    finally:
        store.close()
    passk = ", ".join(f"pass@{k}={v:.3f}" for k, v in enumerate(figures["pass_at_k"], 1) if v is not None)
    print(
        f"calibrated {args.env_id} by {figures['policy']}: {passk}, mean reward {figures['mean_reward']}"
        f"{', ' + figures['badge'] if figures['badge'] else ''}; stored in {store.root} (its hub card: "
        f"/envs/{args.env_id})"
    )
    return 0
