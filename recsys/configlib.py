"""Plain-dict <-> dataclass conversion with errors that name the bad key.

Ray Tune hands a trial a plain dict; it is turned into typed configs once, here, at the top of the
worker. Unknown keys are an error naming the nearest valid key, never silently dropped.

Allowed values are written once, as ``Literal`` types on the fields; ``check_choices`` checks
every such field of a config section (also inside lists and optionals) in one place, so no
``__post_init__`` restates them. Dotted keys (``embeddings.qr.threshold``) are handled by
``dotted_keys`` (the schema's leaves), ``flatten`` (a nested dict to dotted keys) and
``set_dotted``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names the field and the value."""


def nearest(key: str, valid: Iterable[str]) -> str:
    """A ' (did you mean X?)' hint for an unknown key, or '' when nothing is close."""
    match = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


@functools.cache
def _hints_of(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a dataclass (cached: configs are built per trial)."""
    return _hints_of(cls)


def _optional_inner(tp: Any) -> Any:
    """``X`` for ``X | None`` (one non-None member), else ``tp`` unchanged."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return tp


def choices(tp: Any) -> tuple[Any, ...]:
    """The allowed values of a ``Literal`` type (``()`` for any other type)."""
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else ()


def _check_choice(tp: Any, value: Any, path: str) -> None:
    tp = _optional_inner(tp)
    if value is None:
        return
    allowed = choices(tp)
    if allowed:
        if value not in allowed:
            hint = nearest(str(value), [str(a) for a in allowed])
            raise ConfigError(f"{path}={value!r}: not one of {allowed}{hint}")
        return
    if typing.get_origin(tp) in (list, tuple) and isinstance(value, (list, tuple)):
        args = typing.get_args(tp)
        for i, item in enumerate(value):
            _check_choice(args[0] if args else Any, item, f"{path}[{i}]")


def check_choices(cfg: Any, section: str = "") -> None:
    """Raise ``ConfigError`` naming ``section.field`` if a ``Literal`` field of ``cfg`` (or an
    item of a list of them) holds a value its type does not allow."""
    for f in dataclasses.fields(cfg):
        path = f"{section}.{f.name}" if section else f.name
        _check_choice(_hints(type(cfg))[f.name], getattr(cfg, f.name), path)


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, path) if len(inner) == 1 else value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return from_dict(tp, value, path)
    if origin in (list, tuple) and not isinstance(value, (list, tuple)):
        raise ConfigError(f"{path}: expected a list, got {value!r}")
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return {k: _convert(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if origin is list:
        return [_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        item = args[0] if args else Any
        return tuple(_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and not isinstance(value, tp):
        raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
    if tp is int and isinstance(value, bool):
        raise ConfigError(f"{path}: expected int, got {value!r}")
    _check_choice(tp, value, path)
    return value


def from_dict(cls: type[T], data: dict[str, Any], path: str = "") -> T:
    """Build dataclass ``cls`` from a nested plain dict; unknown keys raise ``ConfigError``."""
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key not in names:
            where = f"{path}.{key}" if path else key
            raise ConfigError(f"unknown config key {where!r}{nearest(key, names)}")
    kwargs = {k: _convert(hints[k], v, f"{path}.{k}" if path else k) for k, v in data.items()}
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    """The plain nested dict of a config (lists, not tuples: it round-trips through YAML/JSON)."""

    def plain(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(cfg))


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key of a config schema as a dotted path, e.g. ``embeddings.qr.threshold``."""
    keys: list[str] = []
    for f in dataclasses.fields(cls):
        tp = _optional_inner(_hints(cls)[f.name])
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            keys += dotted_keys(tp, name + ".")
        else:
            keys.append(name)
    return keys


def flatten(data: dict[str, Any], sections: set[str] | None = None) -> dict[str, Any]:
    """A nested dict as dotted keys: ``{"a": {"b": 1}} -> {"a.b": 1}``.

    ``sections``: the dotted paths that are sections; a mapping anywhere else is a leaf value
    (a per-table map, say). ``None``: every non-empty mapping is a section."""

    def walk(node: dict[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in node.items():
            path = f"{prefix}{key}"
            is_section = sections is None or path in sections
            if isinstance(value, dict) and value and is_section:
                out.update(walk(value, path + "."))
            else:
                out[path] = value
        return out

    return walk(data, "")


def set_dotted(data: dict[str, Any], key: str, value: Any, valid: list[str]) -> None:
    """Set ``data['a']['b'] = value`` for key ``a.b``; a key not in ``valid`` raises with a hint."""
    if key not in valid:
        raise ConfigError(f"unknown config key {key!r}{nearest(key, valid)}")
    *parents, leaf = key.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {p!r} is not a section")
    node[leaf] = value


def check(cond: bool, field: str, value: Any, why: str) -> None:
    """Raise ``ConfigError('field=value: why')`` unless ``cond``."""
    if not cond:
        raise ConfigError(f"{field}={value!r}: {why}")


# ---------------------------------------------------------------------------------------------
# Command-line options declared once, on the fields of the dataclass that holds their values

OPTION = "recsys.option"  # the field metadata key of an ``Opt``
KINDS = ("", "count", "positive", "int", "float", "str", "flag")


@dataclasses.dataclass(frozen=True)
class Opt:
    """How a dataclass field is a command-line option (``option``); the parsers are made from it
    (``recsys.cli.add_options``), and so are a sweep's rules of which options a resume restores
    and a growth keeps (``restored``, ``kept``).

    Attributes:
        help: the option's help text.
        flag: its flag (default ``--`` and the field's name with dashes).
        kind: its argparse type: ``count`` (an integer >= 1), ``positive`` (a number > 0),
            ``int``, ``float``, ``str``, ``flag`` (``store_true``); "" by the default's type.
        choices: the values it takes (none: any of its kind).
        metavar: its value's name in the help.
        restored: a resumed sweep runs with the value it started with; a typed other one is
            refused, naming both (the parser's default is then None, to tell typed from not).
        kept: a growth (``--more``) keeps the value the sweep last ran with unless typed.
        group: options of one group exclude each other (``--resume``, ``--more``).
    """

    help: str
    flag: str = ""
    kind: str = ""
    choices: tuple[Any, ...] = ()
    metavar: str | None = None
    restored: bool = False
    kept: bool = False
    group: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"option kind {self.kind!r}: one of {KINDS}")


def option(default: Any, help: str, **how: Any) -> Any:
    """A dataclass field holding a command-line option's value: its ``default`` and ``Opt``
    (``how``: its fields but ``help``)."""
    return dataclasses.field(default=default, metadata={OPTION: Opt(help=help, **how)})


def options(cls: type) -> dict[str, tuple[Opt, Any]]:
    """The command-line options of dataclass ``cls``: field name -> ``(Opt, default)``, in field
    order."""
    out = {}
    for f in dataclasses.fields(cls):
        if OPTION in f.metadata:
            out[f.name] = (f.metadata[OPTION], f.default)
    return out


def flag_of(name: str, opt: Opt) -> str:
    return opt.flag or "--" + name.replace("_", "-")


def restored(cls: type) -> dict[str, str]:
    """The options a resumed sweep restores, by field name: their flags."""
    return {n: flag_of(n, o) for n, (o, _) in options(cls).items() if o.restored}


def kept(cls: type) -> tuple[str, ...]:
    """The options a growth keeps from the sweep's last part unless typed."""
    return tuple(n for n, (o, _) in options(cls).items() if o.kept)
