"""Dotted command-line flags generated from frozen config dataclasses (``--actor.adam.lr`` is ``cfg.actor.adam.lr``).

A flag group is a frozen dataclass. Each field is declared once, with its type (the annotation), its default and its
help (``option``); a field that holds another group (``group``) nests it: ``ActorConfig.adam`` gives
``--actor.adam.*``. A field may name the commands that read it (``commands=("rl",)``); the other commands neither
parse nor show it. ``choices`` and ``minimum`` are checked by ``check_declared`` with errors naming the flag.

Supported field types: ``bool`` (``--flag`` / ``--no-flag``), ``int``, ``float``, ``str``, ``X | None``,
``tuple[X, X]`` (two values) and ``tuple[X, ...]`` (one or more values; with ``repeat=True`` one value per
occurrence: ``--env A --env B``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A flag value or combination the trainer refuses; the message names the flags and says what to do."""


def option(
    default: Any,
    help: str,  # noqa: A002 (argparse's name for it)
    *,
    choices: Collection[str] | None = None,
    minimum: float | None = None,
    commands: tuple[str, ...] | None = None,
    repeat: bool = False,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A flag's field. ``choices``: the allowed values (a registry dict may grow after import: read at use);
    ``minimum``: the smallest allowed value; ``commands``: the commands that read it (None: all that have its group);
    ``repeat``: a ``tuple[X, ...]`` field given as the flag repeated, one value each time; ``aliases``: other full
    dotted names the command line accepts for it (``data.dataset`` for ``--data.prompt_dataset``), e.g. the seed
    README's spelling."""
    meta = {
        "help": help,
        "choices": choices,
        "minimum": minimum,
        "commands": commands,
        "repeat": repeat,
        "aliases": aliases,
    }
    return dataclasses.field(default=default, metadata=meta)


def group(
    cls: type, *, commands: tuple[str, ...] | None = None, only: tuple[str, ...] | None = None, **defaults: Any
) -> Any:
    """A field holding the flag group ``cls``. ``only``: the group's fields this command reads (default: those the
    fields' own ``commands`` allow); ``defaults`` override the group's own (a command's other defaults)."""
    factory = functools.partial(cls, **defaults) if defaults else cls
    return dataclasses.field(default_factory=factory, metadata={"group": True, "commands": commands, "only": only})


@dataclass(frozen=True)
class Flag:
    """One generated flag: ``name`` is the dotted path without dashes (``actor.adam.lr``)."""

    name: str
    kind: Any  # the element type: bool, int, float or str
    nargs: int | str | None  # 2 for tuple[X, X], "+" for tuple[X, ...]
    default: Any
    help: str
    choices: Collection[str] | None
    minimum: float | None
    group: str  # the top-level group ("actor" for actor.adam.lr; "" for a top-level flag such as --env)
    repeat: bool = False  # one value per occurrence of the flag
    aliases: tuple[str, ...] = ()  # other dotted names of the flag on the command line

    @property
    def names(self) -> tuple[str, ...]:
        """The flag's name and its aliases."""
        return (self.name, *self.aliases)


def flags(cls: type, command: str) -> Iterator[Flag]:
    """Every flag of the command config ``cls`` that ``command`` reads, in declaration order."""
    yield from _walk(cls, None, "", command, "", None)


def _walk(
    cls: type, instance: Any, prefix: str, command: str, top: str, only: tuple[str, ...] | None
) -> Iterator[Flag]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        scope = f.metadata.get("commands")
        if (scope is not None and command not in scope) or (only is not None and f.name not in only):
            continue
        name = prefix + f.name
        if f.metadata.get("group"):
            default = getattr(instance, f.name) if instance is not None else f.default_factory()
            yield from _walk(type(default), default, name + ".", command, top or f.name, f.metadata.get("only"))
            continue
        if "help" not in f.metadata:
            continue  # a plain field of the dataclass, not a flag
        kind, nargs = _element_type(hints[f.name], f"{cls.__name__}.{f.name}")
        yield Flag(
            name=name,
            kind=kind,
            nargs=nargs,
            default=getattr(instance, f.name) if instance is not None else f.default,
            help=f.metadata["help"],
            choices=f.metadata.get("choices"),
            minimum=f.metadata.get("minimum"),
            group=top,
            repeat=f.metadata.get("repeat", False),
            aliases=f.metadata.get("aliases", ()),
        )


def _element_type(hint: Any, where: str) -> tuple[Any, int | str | None]:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        if len(args) != 1:
            raise TypeError(f"{where}: a flag's type is one type or `X | None`, got {hint}")
        hint, args = args[0], list(typing.get_args(args[0]))
    if typing.get_origin(hint) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0], "+"
        if len(set(args)) != 1:
            raise TypeError(f"{where}: a tuple flag holds values of one type, got {hint}")
        return args[0], len(args)
    if hint not in (bool, int, float, str):
        raise TypeError(f"{where}: unsupported flag type {hint}")
    return hint, None


def build_parser(cls: type, command: str, description: str | None = None) -> argparse.ArgumentParser:
    """An argparse parser of ``command``'s flags, one help section per flag group."""
    parser = argparse.ArgumentParser(
        prog=f"molt-train {command}",
        usage=f"molt-train {command} [--GROUP.FLAG VALUE ...]",
        description=description,
        allow_abbrev=False,
    )
    sections: dict[str, argparse._ArgumentGroup] = {}
    for flag in flags(cls, command):
        if flag.group not in sections:
            title = f"--{flag.group}.*" if flag.group else "run"
            sections[flag.group] = parser.add_argument_group(title, _group_doc(cls, flag.group))
        section, help_ = sections[flag.group], flag.help.replace("%", "%%")
        names = [f"--{name}" for name in flag.names]
        if flag.kind is bool:
            section.add_argument(
                *names, dest=flag.name, action=argparse.BooleanOptionalAction, default=flag.default, help=help_
            )
            continue
        if flag.repeat:  # argparse appends to a copy of the (list) default
            section.add_argument(
                *names, dest=flag.name, action="append", type=flag.kind, default=list(flag.default), help=help_
            )
            continue
        if flag.default is not None:
            help_ += f" (default: {_shown(flag.default)})"
        metavar: str | tuple[str, ...] = (
            "{" + ",".join(sorted(flag.choices)) + "}" if flag.choices else flag.kind.__name__.upper()
        )
        if isinstance(flag.nargs, int):
            metavar = (metavar,) * flag.nargs
        section.add_argument(
            *names, dest=flag.name, type=flag.kind, nargs=flag.nargs, default=flag.default, help=help_, metavar=metavar
        )
    return parser


def _group_doc(cls: type, name: str) -> str | None:
    """The first line of the group class's docstring."""
    if not name:
        return None
    doc = type(next(f for f in dataclasses.fields(cls) if f.name == name).default_factory()).__doc__
    return doc.strip().splitlines()[0] if doc else None


def from_values(cls: type, values: dict[str, Any]) -> Any:
    """``cls`` built from dotted ``values`` (``{"actor.adam.lr": 1e-3}``); what is absent keeps its default."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("group"):
            kwargs[f.name] = _replaced(f.default_factory(), values, f.name + ".")
        elif f.name in values:
            kwargs[f.name] = _plain(values[f.name])
    return cls(**kwargs)


def _replaced(instance: Any, values: dict[str, Any], prefix: str) -> Any:
    changes = {}
    for f in dataclasses.fields(instance):
        name = prefix + f.name
        if f.metadata.get("group"):
            changes[f.name] = _replaced(getattr(instance, f.name), values, name + ".")
        elif name in values:
            changes[f.name] = _plain(values[name])
    return dataclasses.replace(instance, **changes)


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def parse(cls: type, command: str, argv: Sequence[str] | None, description: str | None = None) -> Any:
    """Parse ``argv`` into ``cls``; a ``ConfigError`` raised while building it exits with status 2 and its message."""
    parser = build_parser(cls, command, description)
    values = vars(parser.parse_args(argv))
    try:
        return from_values(cls, values)
    except ConfigError as exc:
        parser.error(str(exc))


def check_declared(cfg: Any, command: str) -> None:
    """Refuse a value outside its field's ``choices`` or below its ``minimum``, naming the flag."""
    for flag in flags(type(cfg), command):
        value = functools.reduce(getattr, flag.name.split("."), cfg)
        if value is None:
            continue
        if flag.choices is not None and value not in flag.choices:
            raise ConfigError(f"--{flag.name} {value!r} is unknown; choose one of {sorted(flag.choices)}")
        if flag.minimum is not None and value < flag.minimum:
            raise ConfigError(f"--{flag.name} must be >= {flag.minimum:g}, got {value}")


def markdown(commands: dict[str, type], marked: Collection[str] = ()) -> str:
    """A table per flag group of every command's flags: flag (and its aliases), default, the commands that read it,
    help, and "seed" where the flag or an alias is in ``marked`` (the seed README's flags)."""
    rows: dict[str, dict[str, tuple[Flag, dict[str, Any]]]] = {}
    for command, cls in commands.items():
        for flag in flags(cls, command):
            rows.setdefault(flag.group, {}).setdefault(flag.name, (flag, {}))[1][command] = flag.default
    out = []
    for name, table in rows.items():
        out += [
            f"### `--{name}.*`" if name else "### run",
            "",
            "| flag | seed | default | commands | help |",
            "|---|---|---|---|---|",
        ]
        for flag, defaults in table.values():
            shown = sorted({_shown(d) for d in defaults.values()})
            default = (
                f"`{shown[0]}`"
                if len(shown) == 1
                else ", ".join(f"{command}: `{_shown(d)}`" for command, d in defaults.items())
            )
            help_ = flag.help + (f" (one of: {', '.join(sorted(flag.choices))})" if flag.choices else "")
            shown_name = f"`--{flag.name}`" + "".join(f" (alias `--{a}`)" for a in flag.aliases)
            seed = "seed" if any(name in marked for name in flag.names) else ""
            cells = [shown_name, seed, default, ", ".join(defaults), help_.replace("|", "\\|")]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _shown(default: Any) -> str:
    if default == ():
        return "none"
    return " ".join(map(str, default)) if isinstance(default, tuple) else str(default)
