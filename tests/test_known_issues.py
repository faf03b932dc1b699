"""The known-issues table: data that names real upstream issues, marked right for each version."""

from __future__ import annotations

import pytest

from tfdp_utils._known_issues import (
    ISSUES,
    KNOWN_ISSUES,
    Installed,
    assess,
    parse_version,
)

pytestmark = pytest.mark.pure

REQUIRED = (
    "keras#20585",
    "tensorflow#72388",
    "keras#19246",
    "keras#20582",
    "keras#21061",
    "tensorflow#90686",
    "keras#20611",
    "keras#20763",
    "tpu-metadata-wait",
)


def test_the_table_lists_the_issues_that_affect_data_parallel_training() -> None:
    assert set(REQUIRED) <= set(ISSUES)
    assert len(ISSUES) == len(KNOWN_ISSUES)  # no duplicate ids
    for entry in KNOWN_ISSUES:
        assert entry.url.startswith("https://")
        if "#" in entry.issue:
            repo, number = entry.issue.split("#")
            assert entry.url.endswith(f"/{repo}/issues/{number}"), entry
        if entry.fixed_in is not None:
            assert parse_version(entry.fixed_in) > parse_version(entry.affected_from)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3.15.1", (3, 15, 1)), ("2.21.0rc1", (2, 21, 0)), ("3.16.0.dev2025", (3, 16, 0)), ("", ())],
)
def test_parse_version(text: str, expected: tuple[int, ...]) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize(
    ("keras", "verdict"),
    [("3.6.0", "not affected"), ("3.7.0", "affected"), ("3.7.9", "affected"), ("3.8.0", "fixed")],
)
def test_a_bug_fixed_upstream_is_marked_by_the_installed_version(keras: str, verdict: str) -> None:
    found = assess(ISSUES["keras#20611"], Installed(keras=keras, tensorflow="2.18.0"))
    assert found.verdict == verdict


@pytest.mark.parametrize(
    ("keras", "verdict"),
    [("3.8.0.dev2024", "affected"), ("3.8.0rc1", "affected"), ("3.16.0.dev2026102704", "fixed")],
)
def test_a_development_build_of_the_fixing_release_is_not_yet_fixed(
    keras: str, verdict: str
) -> None:
    # keras-nightly (TensorFlow 2.22's Keras) is a development build: 3.8.0.devN predates 3.8.0.
    found = assess(ISSUES["keras#20611"], Installed(keras=keras, tensorflow="2.22.0rc0"))
    assert found.verdict == verdict


def test_keras_3_bugs_do_not_apply_on_tf_keras() -> None:
    found = assess(ISSUES["keras#19246"], Installed(keras=None, tensorflow="2.21.0"))
    assert found.verdict == "not applicable"


@pytest.mark.parametrize(
    ("present", "disabled", "verdict"),
    [(True, False, "worked around"), (True, True, "affected"), (False, False, "fixed")],
)
def test_compat_bugs_are_judged_by_the_probe(present: bool, disabled: bool, verdict: str) -> None:
    installed = Installed(
        keras="3.15.1",
        tensorflow="2.21.0",
        bug_present={"keras#19246": present},
        workarounds_disabled=disabled,
    )
    assert assess(ISSUES["keras#19246"], installed).verdict == verdict


def test_a_bug_compat_has_a_probe_for_is_judged_by_the_probe() -> None:
    installed = Installed(keras="3.15.1", tensorflow="2.21.0", bug_present={"keras#20582": True})
    assert assess(ISSUES["keras#20582"], installed).verdict == "worked around"


def test_hardware_bugs_say_whether_this_machine_can_show_them() -> None:
    issue = ISSUES["tensorflow#90686"]
    without = assess(issue, Installed(keras="3.15.1", tensorflow="2.21.0", gpus=0))
    with_gpus = assess(issue, Installed(keras="3.15.1", tensorflow="2.21.0", gpus=2))
    assert without.verdict == with_gpus.verdict == "affected"
    assert not without.here and with_gpus.here


def test_a_bug_fixed_upstream_says_the_release_and_that_no_patch_is_applied() -> None:
    installed = Installed(
        keras="3.16.0.dev2026", tensorflow="2.21.0", bug_present={"keras#19246": False}
    )
    found = assess(ISSUES["keras#19246"], installed)
    assert found.verdict == "fixed"
    assert found.reason.startswith("fixed upstream in 3.16, patch not applied")


def test_the_tf_keras_autograph_slowness_is_named_upstream_and_what_tfdp_utils_does() -> None:
    issue = ISSUES["tf_keras-autograph"]
    assert "autograph" in issue.note and "2.17" in issue.note and "tf_keras-autograph" in issue.note
    assert assess(issue, Installed(keras=None, tensorflow="2.16.2")).verdict == "worked around"
    assert assess(issue, Installed(keras=None, tensorflow="2.17.1")).verdict == "fixed"
