"""The options mechanism: one ``TypedDict`` declaration gives defaults, checks, the docstring
section and the CLI flags."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypedDict

import pytest

from batchclient._options import (
    Option,
    add_flags,
    describe,
    document,
    flag_values,
    resolve,
    specs,
    split,
)
from batchclient.errors import ConfigurationError


class Settings:
    """A settings object a shell cannot spell."""


class Base(TypedDict, total=False):
    poll_interval_s: Annotated[float, Option(10.0, "Seconds between two polls.")]
    max_retries: Annotated[int, Option(8, "Retries of one HTTP call.")]


class First(Base, total=False):
    flavor: Annotated[Literal["a", "b"] | None, Option(None, "Which variant.")]
    check_model: Annotated[bool, Option(True, "Ask GET /models once per model.")]
    settings: Annotated[Settings | None, Option(None, "Rarer settings.", flag=False)]


class Second(TypedDict, total=False):
    poll_interval_s: Annotated[float, Option(30.0, "Seconds between two polls.")]
    name: Annotated[str | None, Option(None, "A name.")]


def test_specs_keep_declaration_order_and_inherited_entries_first() -> None:
    assert list(specs(First)) == [
        "poll_interval_s", "max_retries", "flavor", "check_model", "settings"
    ]  # fmt: skip
    assert specs(First)["poll_interval_s"].flag == "--poll-interval"
    assert specs(First)["poll_interval_s"].metavar == "SECONDS"
    assert specs(First)["settings"].flag is None
    assert specs(First)["flavor"].choices == ("a", "b")


def test_an_entry_without_an_option_is_a_declaration_error() -> None:
    class Bad(TypedDict, total=False):
        plain: int

    with pytest.raises(TypeError, match=r"Bad\.plain"):
        specs(Bad)


def test_resolve_fills_defaults_and_refuses_unknown_names_and_wrong_types() -> None:
    got = resolve(First, {"max_retries": 2}, who="provider 'x'")
    assert got == {
        "poll_interval_s": 10.0, "max_retries": 2, "flavor": None, "check_model": True,
        "settings": None,
    }  # fmt: skip
    with pytest.raises(
        ConfigurationError, match=r"takes no option poll_interval;.*poll_interval_s"
    ):
        resolve(First, {"poll_interval": 3}, who="provider 'x'")
    with pytest.raises(ConfigurationError, match="max_retries must be int, not '3'"):
        resolve(First, {"max_retries": "3"}, who="provider 'x'")
    with pytest.raises(ConfigurationError, match="max_retries must be int, not True"):
        resolve(First, {"max_retries": True}, who="provider 'x'")
    assert resolve(First, {"poll_interval_s": 1}, who="x")["poll_interval_s"] == 1  # int is float
    settings = Settings()
    assert resolve(First, {"settings": settings}, who="x")["settings"] is settings


def test_split_keeps_the_rest_as_given() -> None:
    ours, rest = split(Second, {"name": "n", "max_model_len": 512}, who="x")
    assert ours == {"poll_interval_s": 30.0, "name": "n"}
    assert rest == {"max_model_len": 512}


def test_describe_and_document_list_every_option_with_its_default() -> None:
    text = describe(First)
    assert "poll_interval_s (default 10.0): Seconds between two polls." in text
    assert "flavor (default None): Which variant." in text
    assert "settings (default None)" in text

    @document(Second)
    class Client:
        """A client."""

    assert Client.__doc__ is not None
    assert Client.__doc__.startswith("A client.\n\n    Options:\n")
    assert "name (default None): A name." in Client.__doc__


def test_flags_are_shared_by_name_and_show_each_providers_default() -> None:
    parser = argparse.ArgumentParser()
    flags = add_flags(parser, [("first", First), ("second", Second)])
    text = parser.format_help()
    assert "--poll-interval SECONDS" in text
    assert "first: 10.0; second: 30.0" in " ".join(text.split())
    assert "--settings" not in text
    assert "--check-model, --no-check-model" in text

    args = parser.parse_args([])
    assert flag_values(args, "first", First, flags) == {}  # not given: the provider's default
    args = parser.parse_args(["--poll-interval", "2.5", "--no-check-model", "--flavor", "b"])
    assert flag_values(args, "first", First, flags) == {
        "poll_interval_s": 2.5, "check_model": False, "flavor": "b"
    }  # fmt: skip
    with pytest.raises(ConfigurationError, match="--check-model, --flavor does not apply"):
        flag_values(args, "second", Second, flags)
    args = parser.parse_args(["--name", "none"])
    assert flag_values(args, "second", Second, flags) == {"name": None}
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-retries", "x"])


class Engine(TypedDict, total=False):
    cpu_cores: Annotated[Sequence[int] | None, Option(None, "Cores to bind.")]
    headers: Annotated[Mapping[str, str] | None, Option(None, "Extra HTTP headers.")]
    resources: Annotated[Mapping[str, Any] | None, Option(None, "Ray resources, 50% of a GPU.")]
    max_retries: Annotated[int, Option(2, "Retries of one engine call.")]


def test_lists_and_mappings_have_flags_and_come_back_in_their_types() -> None:
    parser = argparse.ArgumentParser()
    flags = add_flags(parser, [("engine", Engine)])
    text = " ".join(parser.format_help().split())
    assert "--cpu-cores N [N ...]" in text and "--headers KEY=VALUE" in text
    assert "Ray resources, 50% of a GPU" in text
    args = parser.parse_args(
        ["--cpu-cores", "0", "2", "--headers", "x-a=1", "--headers", "x-b=c=d",
         "--resources", "num_cpus=2", "--resources", "label=gpu"]
    )  # fmt: skip
    assert flag_values(args, "engine", Engine, flags) == {
        "cpu_cores": [0, 2],
        "headers": {"x-a": "1", "x-b": "c=d"},  # a str mapping keeps its text
        "resources": {"num_cpus": 2, "label": "gpu"},  # JSON where it is JSON
    }
    with pytest.raises(SystemExit):
        parser.parse_args(["--headers", "no-equals-sign"])


def test_one_flag_lists_each_providers_own_help_where_they_differ() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser, [("first", First), ("engine", Engine)], only={"max_retries"})
    text = " ".join(parser.format_help().split())
    assert "first: Retries of one HTTP call (default 8); engine: Retries of one engine" in text
    assert "--poll-interval" not in text  # not among ``only``


def test_one_name_with_two_types_is_a_declaration_error() -> None:
    class Other(TypedDict, total=False):
        max_retries: Annotated[str, Option("8", "Retries as text.")]

    with pytest.raises(TypeError, match="max_retries"):
        add_flags(argparse.ArgumentParser(), [("first", First), ("other", Other)])


@dataclass(frozen=True)
class Policy:
    attempts: int = 3


class WithPolicy(TypedDict, total=False):
    policy: Annotated[Policy, Option(Policy(), "The policy.")]
    tuned: Annotated[Policy, Option(Policy(5), "Another.")]


def test_settings_objects_at_their_defaults_are_shown_by_name() -> None:
    text = describe(WithPolicy)
    assert "policy (default Policy()): The policy." in text
    assert "tuned (default Policy(attempts=5)): Another." in text


def test_document_puts_the_options_before_the_raises_section() -> None:
    @document(Second)
    class Client:
        """A client.

        Args:
            url: where.

        Raises (on entering ``async with``):
            ConfigurationError: a bad option.
        """

    doc = Client.__doc__ or ""
    assert doc.index("Args:") < doc.index("    Options:\n") < doc.index("Raises (on entering")
    assert doc.rstrip().endswith("ConfigurationError: a bad option.")
