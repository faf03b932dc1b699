"""Argument and environment checks: what passes, and messages that say received/expected/fix.

Pure. Each check is a table of accepted values (and what they become) and of refused values
with the exact message a user reads.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from fractions import Fraction
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

from tfdp_utils._validate import (
    TRUE_WORDS,
    boolean,
    env_flag,
    env_seconds,
    mapping,
    positive_float,
    positive_int,
    strategy,
    text,
)

pytestmark = pytest.mark.pure


# ------------------------------------------------------------------------- positive_int


@pytest.mark.parametrize(
    ("value", "minimum", "expected"),
    [(1, 1, 1), (64, 1, 64), (np.int64(8), 1, 8), (np.uint8(3), 1, 3), (0, 0, 0), (-2, -5, -2)],
)
def test_positive_int_accepts_whole_numbers(value: Any, minimum: int, expected: int) -> None:
    got = positive_int(value, "n", minimum=minimum)
    assert got == expected and type(got) is int


@pytest.mark.parametrize(
    ("value", "kwargs", "error", "message"),
    [
        (0, {}, ValueError, "n must be a positive integer, but received n=0."),
        (-3, {}, ValueError, "n must be a positive integer, but received n=-3."),
        (1, {"minimum": 2}, ValueError, "n must be an integer >= 2, but received n=1."),
        (
            0,
            {"hint": "Use a multiple of 2."},
            ValueError,
            "n must be a positive integer, but received n=0. Use a multiple of 2.",
        ),
        (True, {}, TypeError, "n must be an integer, but received True of type bool."),
        ("64", {}, TypeError, "n must be an integer, but received '64' of type str."),
        (None, {}, TypeError, "n must be an integer, but received None of type NoneType."),
        (
            64.5,
            {"hint": "Round it."},
            TypeError,
            "n must be an integer, but received 64.5 of type float. Round it.",
        ),
        # A whole float names the integer to pass instead.
        (64.0, {}, TypeError, "n must be an integer, but received 64.0 of type float. Pass n=64."),
    ],
)
def test_positive_int_refuses_with_received_expected_and_fix(
    value: Any, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        positive_int(value, "n", **kwargs)
    assert str(info.value) == message


# ----------------------------------------------------------------------- positive_float


@pytest.mark.parametrize(
    ("value", "allow_zero", "expected"),
    [
        (1, False, 1.0),
        (0.25, False, 0.25),
        (np.float32(0.5), False, 0.5),
        (Fraction(3, 2), False, 1.5),
        (0, True, 0.0),
        (0.0, True, 0.0),
    ],
)
def test_positive_float_accepts_real_numbers(value: Any, allow_zero: bool, expected: float) -> None:
    got = positive_float(value, "timeout", allow_zero=allow_zero)
    assert got == expected and type(got) is float


@pytest.mark.parametrize(
    ("value", "kwargs", "error", "message"),
    [
        (0, {}, ValueError, "timeout must be a positive finite number, but received timeout=0."),
        (
            -1.5,
            {"allow_zero": True},
            ValueError,
            "timeout must be a finite number >= 0, but received timeout=-1.5.",
        ),
        (
            math.inf,
            {"unit": "number of seconds"},
            ValueError,
            "timeout must be a positive finite number of seconds, but received timeout=inf.",
        ),
        (
            math.nan,
            {"hint": "Pass e.g. timeout=30."},
            ValueError,
            "timeout must be a positive finite number, but received timeout=nan. "
            "Pass e.g. timeout=30.",
        ),
        (
            "30",
            {"unit": "number of seconds"},
            TypeError,
            "timeout must be a number of seconds, but received '30' of type str.",
        ),
        (False, {}, TypeError, "timeout must be a number, but received False of type bool."),
        (
            1j,
            {"hint": "Pass a real number."},
            TypeError,
            "timeout must be a number, but received 1j of type complex. Pass a real number.",
        ),
    ],
)
def test_positive_float_refuses_with_received_expected_and_fix(
    value: Any, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        positive_float(value, "timeout", **kwargs)
    assert str(info.value) == message


# ------------------------------------------------------------------------------ boolean


@pytest.mark.parametrize("value", [True, False])
def test_boolean_accepts_python_bools(value: bool) -> None:
    assert boolean(value, "flag") is value


@pytest.mark.parametrize("value", [np.True_, np.False_])
def test_boolean_accepts_numpy_bools_as_documented(value: Any) -> None:
    got = boolean(value, "flag")
    assert got is bool(value)


@pytest.mark.parametrize(
    ("value", "received"),
    [
        ("no", "'no' of type str"),
        ("False", "'False' of type str"),
        (0, "0 of type int"),
        (1, "1 of type int"),
        (None, "None of type NoneType"),
    ],
)
def test_boolean_refuses_look_alikes(value: Any, received: str) -> None:
    with pytest.raises(TypeError) as info:
        boolean(value, "flag")
    assert str(info.value) == f"flag must be True or False, but received {received}."


# -------------------------------------------------------------------- text and mapping


def test_text_accepts_strings_and_refuses_the_rest() -> None:
    assert text("", "name") == ""
    assert text("grpc://h:1", "name") == "grpc://h:1"
    with pytest.raises(TypeError) as info:
        text(b"bytes", "name", hint="Decode it first.")
    assert str(info.value) == (
        "name must be a string, but received b'bytes' of type bytes. Decode it first."
    )


@pytest.mark.parametrize("value", [{}, {"A": "1"}, OrderedDict(), MappingProxyType({}), os.environ])
def test_mapping_accepts_mappings_as_given(value: Any) -> None:
    assert mapping(value, "environ") is value


@pytest.mark.parametrize(
    ("value", "received"),
    [
        ([("A", "1")], "[('A', '1')] of type list"),
        ("A=1", "'A=1' of type str"),
        (None, "None of type NoneType"),
    ],
)
def test_mapping_refuses_the_rest(value: Any, received: str) -> None:
    with pytest.raises(TypeError) as info:
        mapping(value, "environ", hint="Pass dict(os.environ).")
    assert str(info.value) == (
        f"environ must be a mapping such as os.environ or a dict, but received {received}. "
        "Pass dict(os.environ)."
    )


# ----------------------------------------------------------------------------- strategy


class StrategyLike:
    num_replicas_in_sync = 2
    extended = object()


def test_strategy_is_recognised_by_its_attributes() -> None:
    given = StrategyLike()
    assert strategy(given) is given


@pytest.mark.parametrize("value", [None, "mirrored", 2])
def test_strategy_refuses_the_rest_and_says_how_to_get_one(value: Any) -> None:
    with pytest.raises(TypeError) as info:
        strategy(value, "strategy")
    message = str(info.value)
    assert message.startswith(
        "strategy must be a tf.distribute.Strategy (e.g. strategy = tdu.auto_strategy()), "
        f"but received {value!r} of type {type(value).__name__}."
    )
    assert message.endswith("or pass strategy=None to use the strategy in scope.")


# ----------------------------------------------------------------------------- env_flag


@pytest.mark.parametrize(
    ("value", "on"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        ("Yes", True),
        (" on ", True),
        ("on\n", True),
        ("0", False),
        ("false", False),
        ("no", False),
        ("off", False),
        ("", False),
        ("y", False),
        ("2", False),
        ("enabled", False),
    ],
)
def test_env_flag_is_on_only_for_the_true_words(value: str, on: bool) -> None:
    assert env_flag("TFDP_X", {"TFDP_X": value}) is on


def test_env_flag_is_off_when_unset_and_reads_os_environ_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert env_flag("TFDP_X", {}) is False
    monkeypatch.delenv("TFDP_TEST_FLAG", raising=False)
    assert env_flag("TFDP_TEST_FLAG") is False
    monkeypatch.setenv("TFDP_TEST_FLAG", "yes")
    assert env_flag("TFDP_TEST_FLAG") is True
    assert env_flag("TFDP_TEST_FLAG", {}) is False  # an explicit environment wins


def test_the_true_words() -> None:
    assert frozenset({"1", "true", "yes", "on"}) == TRUE_WORDS


# -------------------------------------------------------------------------- env_seconds


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("30", 30.0), ("2.5", 2.5), (" 600 ", 600.0), ("1e3", 1000.0), ("0", 0.0), ("-5", -5.0)],
)
def test_env_seconds_reads_a_number(raw: str, seconds: float) -> None:
    # The sign and the bound are the caller's business (positive_float after it).
    assert env_seconds("TFDP_CLUSTER_TIMEOUT", raw, example=300) == seconds


@pytest.mark.parametrize("raw", ["abc", "30s", "", "1,5"])
def test_env_seconds_names_the_variable_its_value_and_an_example(raw: str) -> None:
    with pytest.raises(ValueError) as info:
        env_seconds("TFDP_CLUSTER_TIMEOUT", raw, example=300.0)
    assert str(info.value) == (
        f"TFDP_CLUSTER_TIMEOUT must be a number of seconds, but received "
        f"TFDP_CLUSTER_TIMEOUT={raw!r}. Set it to e.g. 300."
    )
    assert info.value.__cause__ is None and info.value.__suppress_context__
