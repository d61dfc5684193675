"""Command lines derived from config dataclasses: one flag per field, config files, one place.

Every trainer and experiment of the project declares its knobs as one dataclass whose
docstring documents each field (``name: text`` lines, or ``a / b: text`` for a pair).
:func:`add_config_arguments` turns each field into a ``--kebab-case`` flag whose help is
that text plus the dataclass default; :func:`build_config` builds the dataclass from its
defaults, then a JSON/TOML config file's values, then the flags given. Several dataclasses
can share one parser under different ``section`` names (a TOML table per section), so
``python -m agents.llm train`` offers ``GRPOConfig`` and ``CalibrationConfig`` side by side.

Help text is written for users: Sphinx markup is reduced to plain text and a field's own
"Default X." sentence is dropped, since every flag's help ends with its actual default
(:func:`plain_text`).

Running a command: :func:`one_line_warnings` shows warnings as ``warning (Category): text``
(they are meant for the person at the terminal), and :func:`run_cli` also reports bad input
(``ValueError``, a missing file) as ``prog: message`` with exit code 2 instead of a traceback
(``WMRL_TRACEBACK=1`` shows the traceback).

Functions: :func:`add_config_arguments`, :func:`build_config`, :func:`load_config_file`,
:func:`config_to_dict`, :func:`field_doc`, :func:`plain_text`, :func:`one_line_warnings`,
:func:`run_cli`.

>>> import argparse, dataclasses
>>> @dataclasses.dataclass
... class Demo:
...     '''Attributes:
...         steps: training steps.
...         tags: labels.
...     '''
...     steps: int = 3
...     tags: tuple[str, ...] = ()
>>> parser = argparse.ArgumentParser()
>>> add_config_arguments(parser, Demo)
>>> build_config(Demo, {"steps": 5}, parser.parse_args(["--tags", "a", "b"]))
Demo(steps=5, tags=('a', 'b'))
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import tomllib

__all__ = [
    "add_config_arguments",
    "build_config",
    "load_config_file",
    "config_to_dict",
    "field_doc",
    "plain_text",
    "one_line_warnings",
    "run_cli",
    "USER_ERRORS",
]

#: What :func:`run_cli` reports as one line: the errors bad input raises across the project.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, NotADirectoryError)

_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)\s*(?:<[^`]*>)?`")
_DEFAULT_SENTENCE = re.compile(r"\s*Defaults?:? [^.()]*(?:\.\d[^.]*)*\.\s*$")


def plain_text(text: str, *, drop_default: bool = False) -> str:
    """``text`` without Sphinx markup (roles keep their last name, literals lose their
    backquotes); with ``drop_default``, without a trailing "Default X." sentence.

    >>> plain_text("see :func:`~agents.grpo.grpo_loss` and ``None``; :class:`Env <gymnasium.Env>`")
    'see grpo_loss and None; Env'
    >>> plain_text("gradient clipping. Default 1.0.", drop_default=True)
    'gradient clipping.'
    """

    def role(m: re.Match[str]) -> str:
        name = m.group(1)
        return name.rsplit(".", 1)[-1] if m.group(0).startswith(":") and "~" in m.group(0)[:-1] else name

    out = _ROLE.sub(role, text).replace("``", "")
    if drop_default:
        out = _DEFAULT_SENTENCE.sub("", out)
    return out


def _field_type(cls: type, f: dataclasses.Field) -> tuple[Any, bool]:
    """``(scalar type, is_sequence)`` of a config field (``X | None`` -> X)."""
    hint = typing.get_type_hints(cls)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    if typing.get_origin(hint) is typing.Literal:
        return str, False
    if typing.get_origin(hint) in (tuple, list):
        inner = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return (inner[0] if inner else str), True
    return hint, False


def _literal_choices(cls: type, f: dataclasses.Field) -> list[str] | None:
    """The allowed values of a ``Literal[...]`` field (argparse then refuses others in one line)."""
    hint = typing.get_type_hints(cls)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    return [str(a) for a in typing.get_args(hint)] if typing.get_origin(hint) is typing.Literal else None


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def field_doc(cls: type, name: str) -> str:
    """The documentation of field ``name`` in the docstring of ``cls`` (or of the first base
    class documenting it): the text after ``name:`` (or after ``a / name:`` for documented
    pairs), continuation lines joined."""
    for klass in getattr(cls, "__mro__", (cls,)):
        text = _doc_in(klass.__dict__.get("__doc__") or "", name)
        if text:
            return text
    return ""


def _doc_in(doc: str, name: str) -> str:
    lines = doc.splitlines()
    for k, line in enumerate(lines):
        head, sep, text = line.strip().partition(":")
        if not sep or name not in [h.strip() for h in head.split("/")]:
            continue
        indent = len(line) - len(line.lstrip())
        parts = [text.strip()]
        for nxt in lines[k + 1 :]:
            if not nxt.strip() or len(nxt) - len(nxt.lstrip()) <= indent:
                break
            parts.append(nxt.strip())
        return " ".join(p for p in parts if p)
    return ""


def _none_or(convert: Any) -> Any:
    def parse(text: str) -> Any:
        return None if text.strip().lower() == "none" else convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def _dest(section: str | None, name: str) -> str:
    return f"cfg_{section}__{name}" if section else f"cfg_{name}"


def add_config_arguments(
    parser: argparse.ArgumentParser, cls: type, *, section: str | None = None, skip: tuple[str, ...] = ()
) -> None:
    """One ``--kebab-case`` flag per field of the dataclass ``cls`` (``--<section>-<field>``
    when ``section`` is given), except those in ``skip``. A flag not given leaves the config
    file's value (or the default) in place. Sequences take several values; booleans take
    ``true``/``false``; ``none`` sets an optional field to ``None``."""
    title = f"{cls.__name__}" + (f" (--{section}-*; TOML table [{section}])" if section else "")
    group = parser.add_argument_group(title, plain_text((cls.__doc__ or "").strip().splitlines()[0]))
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        scalar, many = _field_type(cls, f)
        convert = _parse_bool if scalar is bool else scalar
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__}.{f.name} has no default; config fields need one")
        doc = plain_text(field_doc(cls, f.name), drop_default=True)
        help_text = f"{doc} (default: {default!r})".replace("%", "%%")
        flag = f.name.replace("_", "-")
        choices = _literal_choices(cls, f)
        group.add_argument(
            f"--{section}-{flag}" if section else f"--{flag}",
            dest=_dest(section, f.name),
            type=_none_or(convert),
            nargs="+" if many else None,
            default=argparse.SUPPRESS,
            help=help_text,
            choices=choices,
            metavar=("{" + ",".join(choices) + "}")
            if choices
            else scalar.__name__.upper()
            if hasattr(scalar, "__name__")
            else "VALUE",
        )


def load_config_file(path: str | Path, shipped: Path | None = None) -> dict[str, Any]:
    """A JSON or TOML config file as a dict. A bare name is looked up as ``<name>.toml`` in
    the ``shipped`` directory."""
    path = Path(path)
    if shipped is not None and not path.exists() and not path.suffix and (shipped / f"{path}.toml").is_file():
        path = shipped / f"{path}.toml"
    if not path.is_file():
        names = f" (shipped configs: {', '.join(sorted(p.stem for p in shipped.glob('*.toml')))})" if shipped else ""
        raise FileNotFoundError(f"config file {str(path)!r} not found{names}")
    if path.suffix == ".toml":
        return tomllib.loads(path.read_text())
    if path.suffix == ".json":
        return json.loads(path.read_text())
    raise ValueError(f"config file {path} must end in .toml or .json")


def build_config(
    cls: type,
    file_values: Mapping[str, Any] | None = None,
    args: argparse.Namespace | None = None,
    *,
    section: str | None = None,
) -> Any:
    """``cls(**defaults | file_values | flags)``. Unknown keys in the file are an error; the
    string ``"none"`` in a file unsets an optional field (TOML has no null). With ``section``,
    the file's values are its ``[section]`` table and the flags those added under it."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = dict(file_values or {})
    unknown = set(values) - names
    if unknown:
        where = f"[{section}] " if section else ""
        raise ValueError(f"unknown {where}{cls.__name__} settings {sorted(unknown)}; known: {sorted(names)}")
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        if isinstance(value, str) and value.lower() == "none" and type(None) in typing.get_args(hints[name]):
            values[name] = None
    if args is not None:
        prefix = _dest(section, "")
        for key, value in vars(args).items():
            name = key[len(prefix) :]
            if key.startswith(prefix) and name in names:
                values[name] = value
    for f in dataclasses.fields(cls):
        if f.name in values and values[f.name] is not None and _field_type(cls, f)[1]:
            values[f.name] = tuple(values[f.name])
    return cls(**values)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A config dataclass as a JSON-ready dict (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def _one_line_warning(message: Any, category: type, filename: str, lineno: int, line: str | None = None) -> str:
    return f"warning ({category.__name__}): {message}\n"


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Within the block, warnings print as one line each; the previous format is restored
    after (commands also run in-process: tests, notebooks)."""
    previous, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    try:
        yield
    finally:
        warnings.formatwarning = previous


def run_cli(prog: str, body: Callable[[], int], errors: tuple[type[BaseException], ...] = USER_ERRORS) -> int:
    """Run a command's ``body``: one-line warnings, and ``errors`` printed as ``prog: message``
    on stderr with exit code 2 (``WMRL_TRACEBACK=1`` re-raises them).

    >>> def body():
    ...     raise FileNotFoundError("no model at /nowhere")
    >>> run_cli("demo", body)  # stderr: "demo: no model at /nowhere"
    2
    """
    with one_line_warnings():
        try:
            return body()
        except errors as err:
            if os.environ.get("WMRL_TRACEBACK"):
                raise
            print(f"{prog}: {err}", file=sys.stderr)
            return 2
