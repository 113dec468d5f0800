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
import collections.abc
import contextlib
import dataclasses
import functools
import json
import re
import types
import typing
from collections.abc import Collection, Iterable, Mapping
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
    "is_declared",
    "resolve",
    "specs",
    "split",
]

T = TypeVar("T")
_SCALARS = (bool, int, float, str)
_SEQUENCES = (collections.abc.Sequence, list, tuple)
_MAPPINGS = (collections.abc.Mapping, dict)


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
        if not self.option.flag or self.shape is None:
            return None
        return "--" + self.name.removesuffix("_s").replace("_", "-")

    @property
    def scalar(self) -> type | None:
        """The one scalar type (bool, int, float, str) the value is, or None (``X | None``
        counts as ``X``; a ``Literal`` of strings as ``str``)."""
        kind = self._kind()
        return None if kind is None else _scalar_of(kind)

    @property
    def shape(self) -> Literal["scalar", "list", "mapping"] | None:
        """How a shell spells the value: one word (a scalar), several (``Sequence[X]``, X a
        scalar), or repeated ``KEY=VALUE`` words (``Mapping[str, X]``); None: it cannot."""
        kind = self._kind()
        if kind is None:
            return None
        if _scalar_of(kind) is not None:
            return "scalar"
        origin, args = get_origin(kind), get_args(kind)
        if origin in _SEQUENCES and len(args) == 1 and _scalar_of(args[0]) is not None:
            return "list"
        if origin in _MAPPINGS and len(args) == 2 and args[0] is str:
            return "mapping"
        return None

    def _kind(self) -> Any:
        kinds = [a for a in _union_args(self.annotation) if a is not type(None)]
        return kinds[0] if len(kinds) == 1 else _switch(kinds)

    def _word(self) -> type | None:
        """The scalar type of one word of the flag: the value's, or a list's items'."""
        if self.shape == "list":
            return _scalar_of(get_args(self._kind())[0])
        return self.scalar

    @property
    def choices(self) -> tuple[str, ...] | None:
        kind = self._kind()
        if get_origin(kind) is Literal:
            return tuple(str(v) for v in get_args(kind))
        return None

    @property
    def metavar(self) -> str:
        if self.option.metavar:
            return self.option.metavar
        if self.name.endswith("_s"):
            return "SECONDS"
        return {int: "N", float: "NUMBER", str: "TEXT"}.get(self._word() or str, "VALUE")

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


def _switch(kinds: list[Any]) -> Any:
    """``bool | Literal["auto", ...]`` (a switch with named settings besides on and off, such
    as ``prompt_caching``) as a shell spells it: one word, a name or ``true`` / ``false``
    (``Literal`` of them); None for any other union."""
    names = [k for k in kinds if get_origin(k) is Literal]
    if len(kinds) == 2 and bool in kinds and len(names) == 1:
        values = get_args(names[0])
        if all(isinstance(v, str) for v in values):
            return Literal[(*values, "true", "false")]  # type: ignore[valid-type]
    return None


def _is_switch(spec: OptionSpec) -> bool:
    """Whether ``spec`` is a :func:`_switch` option."""
    kinds = [a for a in _union_args(spec.annotation) if a is not type(None)]
    return len(kinds) > 1 and _switch(kinds) is not None


def _scalar_of(kind: Any) -> type | None:
    if get_origin(kind) is Literal:
        return str if all(isinstance(v, str) for v in get_args(kind)) else None
    return kind if kind in _SCALARS else None


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


def is_declared(options: type) -> bool:
    """Whether every entry of the ``TypedDict`` is ``Annotated[..., Option(...)]``."""
    try:
        specs(options)
    except TypeError:
        return False
    return True


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
        wrap = textwrap.TextWrapper(96, pad, pad + "    ", break_on_hyphens=False)
        lines.extend(wrap.wrap(head))
    return "\n".join(lines)


def document(options: type, *, heading: str = "Options") -> Any:
    """A class decorator: the class docstring gets ``heading`` and :func:`describe` of
    ``options`` before its ``Raises`` section, else at its end (``help(Client)`` shows every
    option where it is declared)."""

    def decorate(cls: type[T]) -> type[T]:
        body = (cls.__doc__ or "").rstrip()
        section = f"    {heading}:\n{describe(options)}\n"
        lines = body.split("\n")
        at = next(
            (i for i, line in enumerate(lines) if re.fullmatch(r"\s*Raises( \(.*\))?:", line)), None
        )
        if at is None:
            cls.__doc__ = f"{body}\n\n{section}"
        else:
            head, tail = "\n".join(lines[:at]).rstrip(), "\n".join(lines[at:])
            cls.__doc__ = f"{head}\n\n{section}\n{tail}\n"
        return cls

    return decorate


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        with contextlib.suppress(TypeError):
            if value == type(value)():  # a settings object at its defaults: not every field
                return type(value).__name__ + "()"
    if type(value).__repr__ is object.__repr__:  # type: ignore[comparison-overlap]
        return type(value).__name__ + "()"
    return repr(value)


Flags = dict[str, list[tuple[str, OptionSpec]]]
"""The CLI's provider flags: option name -> the ``(provider, declaration)`` pairs behind it."""


def add_flags(
    parser: argparse.ArgumentParser | Any,
    providers: Iterable[tuple[str, type]],
    *,
    only: Collection[str] | None = None,
) -> Flags:
    """Add one flag per option the CLI offers, over every ``(provider name, options)`` pair
    (``only``: just these option names): an option several providers declare is one flag
    whose help gives each one's default. The flags default to "not given" (absent from the
    namespace), so a provider's own default applies. A ``Sequence`` option takes several
    values (``--cpu-cores 0 1``), a ``Mapping`` one repeated ``KEY=VALUE`` words (values read
    as JSON where they are, unless the mapping holds ``str``). Returns the flags' providers by
    option name (for :func:`flag_values`).

    Raises:
        TypeError: two providers declare one option name with values of different types.
    """
    by_name: Flags = {}
    for provider, options in providers:
        for spec in specs(options).values():
            if spec.flag is not None and (only is None or spec.name in only):
                by_name.setdefault(spec.name, []).append((provider, spec))
    for name, declared in by_name.items():
        first = declared[0][1]
        for provider, spec in declared[1:]:
            if _kind_of(spec) != _kind_of(first):
                raise TypeError(f"option {name}: {provider} and {declared[0][0]} differ in type")
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        kwargs["help"] = _flag_help(declared).replace("%", "%%")  # argparse formats it
        if first.shape == "scalar" and first.scalar is bool:
            parser.add_argument(str(first.flag), action=argparse.BooleanOptionalAction, **kwargs)
            continue
        if first.choices and _is_switch(first):  # checked by its parser: a word becomes a bool
            kwargs["metavar"] = "{" + ",".join(first.choices) + "}"
        elif first.choices:
            kwargs["choices"] = first.choices
        else:
            kwargs["metavar"] = "KEY=VALUE" if first.shape == "mapping" else first.metavar
        if first.shape == "list":
            kwargs["nargs"] = "+"
        elif first.shape == "mapping":
            kwargs["action"] = "append"
        parser.add_argument(str(first.flag), type=_parser_of(first), **kwargs)
    return by_name


_FIRST_SENTENCE = re.compile(r"(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Z])")


def _kind_of(spec: OptionSpec) -> tuple[Any, ...]:
    return spec.shape, spec.scalar, spec.choices


def _flag_help(declared: list[tuple[str, OptionSpec]]) -> str:
    """``providers: help (default X)``, the help's first sentence (``batchclient providers``
    prints all of it); providers that differ in help or default are listed one after the
    other, each with its own."""
    groups: dict[tuple[str, str], list[str]] = {}
    for provider, spec in declared:
        text = _FIRST_SENTENCE.split(spec.help, maxsplit=1)[0].rstrip(".")
        groups.setdefault((text, _shown(spec.default)), []).append(provider)
    helps = {text for text, _ in groups}
    if len(helps) == 1:  # one text: each provider's default after it
        defaults: dict[str, list[str]] = {}
        for (_, default), names in groups.items():
            defaults.setdefault(default, []).extend(names)
        where = ", ".join(p for p, _ in declared)
        if len(defaults) == 1:
            return f"{where}: {next(iter(helps))} (default {next(iter(defaults))})"
        each = "; ".join(f"{', '.join(names)}: {d}" for d, names in defaults.items())
        return f"{where}: {next(iter(helps))} (default {each})"
    return "; ".join(
        f"{', '.join(names)}: {text} (default {default})"
        for (text, default), names in groups.items()
    )


def _parser_of(spec: OptionSpec) -> Any:
    """The ``type=`` of ``spec``'s flag: one word (of a list's words) to its value, or a
    ``KEY=VALUE`` word to a ``(key, value)`` pair."""
    kind = spec._word()
    nullable = type(None) in _union_args(spec.annotation)

    switch = _is_switch(spec)

    def parse(text: str) -> Any:
        if nullable and spec.shape == "scalar" and text.lower() in ("none", "null"):
            return None
        if switch:
            if text not in (spec.choices or ()):
                raise argparse.ArgumentTypeError(f"{text!r} is not one of {spec.choices}")
            return text == "true" if text in ("true", "false") else text
        assert kind is not None
        return kind(text)

    def pair(text: str) -> tuple[str, Any]:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
        if get_args(spec._kind())[1] is str:
            return key, value
        try:
            return key, json.loads(value)
        except ValueError:
            return key, value

    if spec.shape == "mapping":
        pair.__name__ = "KEY=VALUE"
        return pair
    parse.__name__ = (kind or str).__name__  # argparse names it in "invalid int value"
    return parse


def flag_values(
    args: argparse.Namespace, provider: str, options: type, flags: Flags
) -> dict[str, Any]:
    """The options given as flags for ``provider`` (declared by ``options``), as values of
    their declared types (a mapping's ``KEY=VALUE`` words as a dict).

    Raises:
        ConfigurationError: a flag was given that ``provider`` does not take.
    """
    given = {name: getattr(args, name) for name in flags if hasattr(args, name)}
    declared = specs(options)
    wrong = sorted(str(flags[n][0][1].flag) for n in given if n not in declared)
    if wrong:
        raise ConfigurationError(f"{', '.join(wrong)} does not apply to provider {provider!r}")
    for name, value in given.items():
        if declared[name].shape == "mapping":
            given[name] = dict(value)
    return given
