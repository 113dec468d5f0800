"""The options mechanism: one ``TypedDict`` declaration gives defaults, checks, the docstring
section and the CLI flags."""

from __future__ import annotations

import argparse
from typing import Annotated, Literal, TypedDict

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
