"""Options declared once: a provider's keyword options as one ``TypedDict``.

Each provider declares its options in one ``TypedDict`` whose every entry is
``Annotated[<type>, Option(<default>, "<what it does, with units>")]``. Everything else
derives from that declaration, so no second copy exists to drift:

- the provider fills in the defaults and refuses unknown names with :func:`resolve` (or
  :func:`split`, when the rest are vLLM engine arguments);
- the client takes them as ``**options: Unpack[XOptions]`` and hands them on; its docstring's
  option list is :func:`describe` (appended by :func:`document`);
- the provider registry lists them (names, defaults, help) for its errors and for
  ``batchclient providers``;
- the CLI adds one flag per option whose type a shell can spell (:func:`add_flags`): the
  flag's default is "not given", so the provider's own default applies, and its help lists
  each provider's default.

Naming (``docs/design.md``, "Naming"): options are keyword-only after the URL (or model);
a duration in seconds ends in ``_s`` (its flag drops the suffix: ``poll_interval_s`` is
``--poll-interval SECONDS``); ``max_retries`` counts retries of one HTTP call,
``max_attempts`` remote batches one request is sent in.
"""

from __future__ import annotations

import argparse
import functools
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args, get_origin

from .errors import ConfigurationError

__all__ = [
    "Option",
    "OptionSpec",
    "add_flags",
    "describe",
    "document",
    "flag_values",
    "resolve",
    "specs",
    "split",
]

T = TypeVar("T")
_SCALARS = (bool, int, float, str)


@dataclass(frozen=True)
class Option:
    """One option's declaration: ``default`` (used when the option is not given), ``help``
    (one or two sentences with units; no markup: it is printed by ``--help`` as is),
    ``flag``: whether the CLI offers it (False for settings objects a shell cannot spell),
    ``metavar``: the flag's placeholder (default: ``SECONDS`` for ``*_s``, else the type)."""

    default: Any
    help: str
    flag: bool = True
    metavar: str | None = None


@dataclass(frozen=True)
class OptionSpec:
    """An option as declared: its ``name``, value type (``annotation``, without
    ``Annotated``) and :class:`Option`."""

    name: str
    annotation: Any
    option: Option

    @property
    def default(self) -> Any:
        return self.option.default

    @property
    def help(self) -> str:
        return self.option.help

    @property
    def flag(self) -> str | None:
        """The CLI flag (``--poll-interval`` for ``poll_interval_s``), or None when the CLI
        does not offer this option (not declared for it, or not a type a shell can spell)."""
        if not self.option.flag or self.scalar is None:
            return None
        return "--" + self.name.removesuffix("_s").replace("_", "-")

    @property
    def scalar(self) -> type | None:
        """The one scalar type (bool, int, float, str) the value is, or None (``X | None``
        counts as ``X``; a ``Literal`` of strings as ``str``)."""
        kinds = [a for a in _union_args(self.annotation) if a is not type(None)]
        if len(kinds) != 1:
            return None
        kind = kinds[0]
        if get_origin(kind) is Literal:
            return str if all(isinstance(v, str) for v in get_args(kind)) else None
        return kind if kind in _SCALARS else None

    @property
    def choices(self) -> tuple[str, ...] | None:
        kinds = [a for a in _union_args(self.annotation) if a is not type(None)]
        if len(kinds) == 1 and get_origin(kinds[0]) is Literal:
            return tuple(str(v) for v in get_args(kinds[0]))
        return None

    @property
    def metavar(self) -> str:
        if self.option.metavar:
            return self.option.metavar
        if self.name.endswith("_s"):
            return "SECONDS"
        return {int: "N", float: "X", str: "TEXT"}.get(self.scalar or str, "VALUE")

    def check(self, value: Any, who: str) -> None:
        """Raise ``ConfigurationError`` when ``value`` is plainly not of a scalar option's
        type (an ``int`` is a ``float``; a ``bool`` is not an ``int``); others pass."""
        kinds = _union_args(self.annotation)
        if not all(k in _SCALARS or k is type(None) for k in kinds):
            return  # a settings object, a path, a mapping: checked where it is used
        if any(_is(value, k) for k in kinds):
            return
        names = " or ".join(getattr(k, "__name__", str(k)) for k in kinds)
        raise ConfigurationError(f"{who}: option {self.name} must be {names}, not {value!r}")


def _is(value: Any, kind: Any) -> bool:
    if kind is type(None):
        return value is None
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _union_args(annotation: Any) -> tuple[Any, ...]:
    if get_origin(annotation) in (typing.Union, types.UnionType):
        return get_args(annotation)
    return (annotation,)


@functools.cache
def specs(options: type) -> dict[str, OptionSpec]:
    """The options a ``TypedDict`` declares, by name, in declaration order (inherited ones
    first).

    Raises:
        TypeError: an entry is not ``Annotated[..., Option(...)]`` (a declaration error).
    """
    hints = typing.get_type_hints(options, include_extras=True)
    out: dict[str, OptionSpec] = {}
    for name, hint in hints.items():
        meta = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Option)]
        if get_origin(hint) is not typing.Annotated or len(meta) != 1:
            raise TypeError(f"{options.__name__}.{name} is not Annotated[..., Option(...)]")
        out[name] = OptionSpec(name, get_args(hint)[0], meta[0])
    return out


def resolve(options: type[T], given: Mapping[str, Any], *, who: str) -> T:
    """``given`` with every option ``options`` declares filled in (the default where absent),
    as the ``TypedDict`` itself (a plain dict).

    Raises:
        ConfigurationError: a name ``options`` does not declare (the message lists the
            declared ones), or a scalar option given a value of another type. ``who`` names
            the provider in the message.
    """
    ours, rest = split(options, given, who=who)
    if rest:
        raise ConfigurationError(
            f"{who} takes no option {', '.join(sorted(rest))}; its options are "
            f"{', '.join(specs(typing.cast(type, options)))}"
        )
    return ours


def split(options: type[T], given: Mapping[str, Any], *, who: str) -> tuple[T, dict[str, Any]]:
    """``given`` split in two: the declared options, checked and filled in as
    :func:`resolve` does, and the rest as given (vLLM engine arguments, say).

    Raises:
        ConfigurationError: a scalar option given a value of another type.
    """
    declared = specs(typing.cast(type, options))
    ours: dict[str, Any] = {}
    for name, spec in declared.items():
        if name in given:
            spec.check(given[name], who)
            ours[name] = given[name]
        else:
            ours[name] = spec.default
    rest = {k: v for k, v in given.items() if k not in declared}
    return typing.cast(T, ours), rest


def describe(options: type, *, indent: int = 8) -> str:
    """The options as a docstring section: ``name (default X): help``, one entry each,
    wrapped at 96 columns."""
    import textwrap

    lines: list[str] = []
    pad = " " * indent
    for spec in specs(options).values():
        head = f"{spec.name} (default {_shown(spec.default)}): {spec.help}"
        lines.extend(textwrap.wrap(head, 96, initial_indent=pad, subsequent_indent=pad + "    "))
    return "\n".join(lines)


def document(options: type, *, heading: str = "Options") -> Any:
    """A class decorator: the class docstring gets ``heading`` and :func:`describe` of
    ``options`` at its end (``help(Client)`` shows every option where it is declared)."""

    def decorate(cls: type[T]) -> type[T]:
        body = (cls.__doc__ or "").rstrip()
        cls.__doc__ = f"{body}\n\n    {heading}:\n{describe(options)}\n"
        return cls

    return decorate


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if type(value).__repr__ is object.__repr__:  # type: ignore[comparison-overlap]
        return type(value).__name__ + "()"
    return repr(value)


def add_flags(
    parser: argparse.ArgumentParser | Any, providers: Iterable[tuple[str, type]]
) -> dict[str, list[tuple[str, OptionSpec]]]:
    """Add one flag per option the CLI offers, over every ``(provider name, options)`` pair:
    an option several providers declare is one flag whose help gives each one's default.
    The flags default to "not given" (absent from the namespace), so a provider's own
    default applies. Returns the flags' providers by option name (for :func:`flag_values`).
    """
    by_name: dict[str, list[tuple[str, OptionSpec]]] = {}
    for provider, options in providers:
        for spec in specs(options).values():
            if spec.flag is not None:
                by_name.setdefault(spec.name, []).append((provider, spec))
    for name, declared in by_name.items():
        first = declared[0][1]
        flag = str(first.flag)
        defaults: dict[str, list[str]] = {}
        for provider, spec in declared:
            defaults.setdefault(_shown(spec.default), []).append(provider)
        where = ", ".join(p for p, _ in declared)
        if len(defaults) == 1:
            default_text = f"default {next(iter(defaults))}"
        else:
            each = (f"{', '.join(p)}: {d}" for d, p in defaults.items())
            default_text = "default " + "; ".join(each)
        text = f"{where}: {first.help.rstrip('.')} ({default_text})"
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": text}
        if first.scalar is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
            continue
        kwargs["metavar"] = first.metavar
        if first.choices:
            kwargs["choices"] = first.choices
            kwargs.pop("metavar")
        parser.add_argument(flag, type=_parser_of(first), **kwargs)
    return by_name


def _parser_of(spec: OptionSpec) -> Any:
    kind = spec.scalar
    nullable = type(None) in _union_args(spec.annotation)

    def parse(text: str) -> Any:
        if nullable and text.lower() in ("none", "null"):
            return None
        assert kind is not None
        return kind(text)

    parse.__name__ = (kind or str).__name__  # argparse names it in "invalid int value"
    return parse


def flag_values(
    args: argparse.Namespace, provider: str, options: type, flags: Mapping[str, Any]
) -> dict[str, Any]:
    """The options given as flags for ``provider`` (declared by ``options``).

    Raises:
        ConfigurationError: a flag was given that ``provider`` does not take.
    """
    given = {name: getattr(args, name) for name in flags if hasattr(args, name)}
    declared = specs(options)
    wrong = sorted(str(flags[n][0][1].flag) for n in given if n not in declared)
    if wrong:
        raise ConfigurationError(f"{', '.join(wrong)} does not apply to provider {provider!r}")
    return given
