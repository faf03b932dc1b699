"""The checkpoint folder without TensorFlow: names, the directory check, atomic saves, resumes.

A checkpoint is a folder ``ckpt-<step>`` holding ``state.json`` and whatever ``write(prefix)``
wrote under the prefix ``variables``; here ``write`` is a plain function writing TensorFlow-like
files (``variables.index``, ``variables.data-...``) and ``check`` one that reads them back. A
save is atomic (cut short, it leaves nothing), keeps the last ``keep``, and ``latest`` skips a
damaged newest checkpoint with a WARNING naming it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tfdp_utils.preemption import _store as store

pytestmark = pytest.mark.pure

INDEX = "variables.index"
DATA = "variables.data-00000-of-00001"


def write_variables(payload: str = "weights") -> Callable[[str], None]:
    """A ``write(prefix)`` that writes the two files TensorFlow's Checkpoint.write writes."""

    def write(prefix: str) -> None:
        Path(prefix + ".index").write_text("index")
        Path(prefix + DATA[len("variables") :]).write_text(payload)

    return write


def read_variables(prefix: str) -> str:
    """A ``check(prefix)`` that fails like a reader on missing or damaged files."""
    if Path(prefix + ".index").read_text() != "index":
        raise ValueError("the index is damaged")
    return Path(prefix + DATA[len("variables") :]).read_text()


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def save(directory: Path, step: int, keep: int | None = None, **state: Any) -> store.Saved:
    return store.save(str(directory), step, state, write_variables(f"step {step}"), keep=keep)


# -- names -----------------------------------------------------------------------------------


def test_a_folder_is_named_after_its_step_with_twelve_digits() -> None:
    assert store.folder_name(120) == "ckpt-000000000120"
    assert store.folder_name(0) == "ckpt-000000000000"


@pytest.mark.parametrize("step", [0, 1, 7, 120, 999_999_999_999, 10**12, 10**15 + 3])
def test_the_step_of_a_folder_name_is_its_step(step: int) -> None:
    assert store.step_of(store.folder_name(step)) == step


def test_folder_names_sort_in_step_order() -> None:
    steps = [100, 9, 2, 10, 99, 1000, 0, 123_456_789]
    assert sorted(store.folder_name(s) for s in steps) == [
        store.folder_name(s) for s in sorted(steps)
    ]


@pytest.mark.parametrize(
    "name",
    [
        "ckpt-",
        "ckpt-abc",
        "ckpt-12x",
        "ckpt--1",
        "ckpt-1.5",
        "ckpt-000000000120.tmp",
        ".tmp-ckpt-000000000120-ab12",
        "variables",
        "state.json",
        "checkpoint",
        "000000000120",
    ],
)
def test_other_names_have_no_step(name: str) -> None:
    assert store.step_of(name) is None


@pytest.mark.parametrize("name", ["ckpt-²", "ckpt-①"])
def test_a_folder_named_with_non_ascii_digits_is_not_a_checkpoint(
    tmp_path: Path, name: str
) -> None:
    save(tmp_path, 5)
    (tmp_path / name).mkdir()
    assert store.step_of(name) is None
    found = store.latest(str(tmp_path), read_variables)
    assert found is not None and found.step == 5


# -- the directory ---------------------------------------------------------------------------


def test_check_directory_creates_the_folder_and_returns_its_absolute_path(
    tmp_path: Path,
) -> None:
    wanted = tmp_path / "a" / "b"
    path = store.check_directory(str(wanted))
    assert path == str(wanted)
    assert os.path.isdir(wanted)
    assert listing(wanted) == []  # the writability probe leaves nothing behind


def test_check_directory_takes_a_path_object_and_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert store.check_directory(tmp_path / "p") == str(tmp_path / "p")
    monkeypatch.chdir(tmp_path)
    assert store.check_directory("relative/here") == str(tmp_path / "relative" / "here")
    assert os.path.isdir(tmp_path / "relative" / "here")


def test_check_directory_keeps_an_existing_folder_and_its_checkpoints(tmp_path: Path) -> None:
    save(tmp_path, 3)
    assert store.check_directory(str(tmp_path)) == str(tmp_path)
    assert listing(tmp_path) == ["ckpt-000000000003"]


@pytest.mark.parametrize("url", ["gs://bucket/checkpoints", "s3://b/c", "file:///tmp/x"])
def test_check_directory_refuses_a_url(url: str) -> None:
    with pytest.raises(ValueError) as raised:
        store.check_directory(url)
    message = str(raised.value)
    assert repr(url) in message
    assert "URL" in message and "Mount" in message


def test_check_directory_refuses_a_file(tmp_path: Path) -> None:
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")
    with pytest.raises(OSError) as raised:  # NotADirectoryError
        store.check_directory(str(a_file))
    assert isinstance(raised.value, NotADirectoryError)
    assert repr(str(a_file)) in str(raised.value)
    assert "is a file, not a folder" in str(raised.value)
    assert a_file.read_text() == "x"


def test_check_directory_refuses_a_folder_under_a_file(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(OSError) as raised:
        store.check_directory(str(a_file / "below"))
    assert str(a_file / "below") in str(raised.value)


@pytest.mark.parametrize("value", [None, 42, "", b"/tmp/checkpoints", ["/tmp"]])
def test_check_directory_refuses_what_is_not_a_path(value: Any) -> None:
    with pytest.raises(TypeError) as raised:
        store.check_directory(value)
    message = str(raised.value)
    assert f"directory={value!r}" in message
    assert "not a folder path" in message


# -- saving ----------------------------------------------------------------------------------


def test_a_save_is_a_step_folder_with_the_state_and_the_variables(tmp_path: Path) -> None:
    saved = store.save(
        str(tmp_path), 120, {"epoch": 2, "step_in_epoch": 4}, write_variables("w"), keep=None
    )
    folder = tmp_path / "ckpt-000000000120"
    assert listing(tmp_path) == ["ckpt-000000000120"]
    assert listing(folder) == sorted(["state.json", INDEX, DATA])
    assert (folder / DATA).read_text() == "w"
    on_disk = json.loads((folder / "state.json").read_text())
    assert on_disk["epoch"] == 2 and on_disk["step_in_epoch"] == 4 and on_disk["step"] == 120
    assert saved.path == str(folder)
    assert saved.step == 120
    assert saved.variables == str(folder / "variables")
    assert dict(saved.state) == on_disk


def test_write_is_given_a_prefix_named_variables_in_a_hidden_folder_of_the_directory(
    tmp_path: Path,
) -> None:
    prefixes: list[str] = []

    def write(prefix: str) -> None:
        prefixes.append(prefix)
        write_variables()(prefix)

    store.save(str(tmp_path), 5, {}, write, keep=None)
    assert len(prefixes) == 1
    folder, name = os.path.split(prefixes[0])
    assert name == "variables"
    assert os.path.dirname(folder) == str(tmp_path)
    assert os.path.basename(folder).startswith(".")


def test_a_save_in_progress_is_not_yet_a_checkpoint(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def write(prefix: str) -> None:
        write_variables()(prefix)
        seen["exists"] = (tmp_path / "ckpt-000000000005").exists()
        seen["latest"] = store.latest(str(tmp_path), read_variables)

    store.save(str(tmp_path), 5, {}, write, keep=None)
    assert seen == {"exists": False, "latest": None}


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_write_that_fails_leaves_no_checkpoint_and_no_temporary_folder(
    tmp_path: Path, error: BaseException
) -> None:
    save(tmp_path, 3)

    def write(prefix: str) -> None:
        Path(prefix + ".index").write_text("half")
        raise error

    with pytest.raises(type(error)):
        store.save(str(tmp_path), 4, {}, write, keep=None)
    assert listing(tmp_path) == ["ckpt-000000000003"]
    assert store.latest(str(tmp_path), read_variables).step == 3


def test_only_the_last_keep_checkpoints_are_kept(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8, 10):
        save(tmp_path, step, keep=2)
    assert listing(tmp_path) == ["ckpt-000000000008", "ckpt-000000000010"]


def test_keep_one_keeps_the_checkpoint_just_saved(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        saved = save(tmp_path, step, keep=1)
        assert listing(tmp_path) == [os.path.basename(saved.path)]
    assert listing(tmp_path) == ["ckpt-000000000003"]


def test_keep_none_keeps_every_checkpoint(tmp_path: Path) -> None:
    for step in range(1, 6):
        save(tmp_path, step, keep=None)
    assert [store.step_of(name) for name in listing(tmp_path)] == [1, 2, 3, 4, 5]


def test_steps_beyond_twelve_digits_are_kept_in_step_order(tmp_path: Path) -> None:
    for step in (999_999_999_998, 10**12, 999_999_999_999):
        save(tmp_path, step, keep=2)
    assert sorted(store.step_of(name) for name in listing(tmp_path)) == [
        999_999_999_999,
        10**12,
    ]
    assert store.latest(str(tmp_path), read_variables).step == 10**12


def test_saving_the_same_step_twice_keeps_the_first(tmp_path: Path) -> None:
    first = save(tmp_path, 7, reason="first")
    calls: list[str] = []

    def write(prefix: str) -> None:
        calls.append(prefix)
        write_variables("second")(prefix)

    again = store.save(str(tmp_path), 7, {"reason": "second"}, write, keep=None)
    assert calls == []
    assert again.path == first.path
    assert again.state["reason"] == "first"
    assert (Path(first.path) / DATA).read_text() == "step 7"
    assert listing(tmp_path) == ["ckpt-000000000007"]


def test_a_non_chief_scratch_save_writes_then_leaves_nothing_behind(tmp_path: Path) -> None:
    save(tmp_path, 3)
    written: list[list[str]] = []

    def write(prefix: str) -> None:
        write_variables()(prefix)
        written.append(sorted(os.listdir(os.path.dirname(prefix))))

    store.scratch_save(str(tmp_path), 1, write)
    assert written == [sorted([INDEX, DATA])]
    assert listing(tmp_path) == ["ckpt-000000000003"]


def test_a_scratch_save_that_fails_leaves_nothing_behind_either(tmp_path: Path) -> None:
    def write(prefix: str) -> None:
        write_variables()(prefix)
        raise RuntimeError("collective failed")

    with pytest.raises(RuntimeError, match="collective failed"):
        store.scratch_save(str(tmp_path), 2, write)
    assert listing(tmp_path) == []


# -- resuming --------------------------------------------------------------------------------


def test_latest_is_the_newest_checkpoint_that_reads_back(tmp_path: Path) -> None:
    for step in (3, 12, 6):
        save(tmp_path, step, epoch=step)
    checked: list[str] = []

    def check(prefix: str) -> None:
        checked.append(prefix)
        read_variables(prefix)

    found = store.latest(str(tmp_path), check)
    assert found is not None
    assert found.step == 12
    assert found.path == str(tmp_path / "ckpt-000000000012")
    assert found.state["epoch"] == 12
    assert checked == [str(tmp_path / "ckpt-000000000012" / "variables")]


def test_latest_of_an_empty_or_missing_directory_is_none(tmp_path: Path) -> None:
    assert store.latest(str(tmp_path), read_variables) is None
    assert store.latest(str(tmp_path / "missing"), read_variables) is None


def test_latest_skips_a_newer_checkpoint_whose_variables_do_not_read_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save(tmp_path, 4)
    save(tmp_path, 8)
    damaged = tmp_path / "ckpt-000000000008"
    (damaged / INDEX).write_text("garbage")
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        found = store.latest(str(tmp_path), read_variables)
    assert found is not None and found.step == 4
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].name == "tfdp_utils"
    assert str(damaged) in warnings[0].getMessage()
    assert "the index is damaged" in warnings[0].getMessage()
    assert listing(tmp_path) == ["ckpt-000000000004", "ckpt-000000000008"]  # nothing deleted


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: path.unlink(),
        lambda path: path.write_text('{"format": 1, "step": '),
        lambda path: path.write_text(""),
        lambda path: path.write_text("[1, 2]"),
        lambda path: path.write_text('{"format": 99, "step": 8}'),
        lambda path: path.write_bytes(b"\xff\xfe\x00"),
    ],
    ids=["missing", "cut-short", "empty", "not-an-object", "other-format", "not-text"],
)
def test_latest_skips_a_checkpoint_whose_state_is_missing_or_garbled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], Any]
) -> None:
    save(tmp_path, 4)
    save(tmp_path, 8)
    damage(tmp_path / "ckpt-000000000008" / "state.json")
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        found = store.latest(str(tmp_path), read_variables)
    assert found is not None and found.step == 4
    assert str(tmp_path / "ckpt-000000000008") in caplog.text
    assert "state.json" in caplog.text


def test_latest_is_none_when_no_checkpoint_reads_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save(tmp_path, 1)
    save(tmp_path, 2)

    def check(prefix: str) -> None:
        raise OSError("unreadable")

    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        assert store.latest(str(tmp_path), check) is None
    assert str(tmp_path / "ckpt-000000000001") in caplog.text
    assert str(tmp_path / "ckpt-000000000002") in caplog.text


def test_latest_ignores_temporary_folders_and_other_files(tmp_path: Path) -> None:
    save(tmp_path, 5)
    leftover = tmp_path / ".tmp-ckpt-000000000009-abc"
    leftover.mkdir()
    write_variables()(str(leftover / "variables"))
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "ckpt-latest").mkdir()
    found = store.latest(str(tmp_path), read_variables)
    assert found is not None and found.step == 5


def test_clear_temporary_removes_leftovers_of_cut_short_saves_only(tmp_path: Path) -> None:
    save(tmp_path, 5)
    for name in (".tmp-ckpt-000000000009-abc", ".tmp-worker-1-xyz"):
        (tmp_path / name).mkdir()
        write_variables()(str(tmp_path / name / "variables"))
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".probe-abc").write_text("x")  # another worker's probe, maybe in use
    store.clear_temporary(str(tmp_path))
    assert listing(tmp_path) == [".probe-abc", "ckpt-000000000005", "notes.txt"]
    assert listing(tmp_path / "ckpt-000000000005") == sorted(["state.json", INDEX, DATA])
