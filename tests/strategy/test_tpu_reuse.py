"""connect_tpu reuses a TPU system this process already initialised, as TensorFlow's own
auto_strategy does: initialising it again would wipe what the program placed on the TPU.
TensorFlow's TPU calls are replaced by recorders (no TPU here)."""

from __future__ import annotations

from typing import Any

import pytest

from tfdp_utils._tf import tf
from tfdp_utils.strategy import _build


class _Resolver:
    def __init__(self, tpu: str | None = None) -> None:
        self._tpu = tpu

    def master(self) -> str:
        return ""  # a local TPU: no worker to reach


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from tensorflow.python.tpu import tpu_strategy_util

    made: list[str] = []
    monkeypatch.setattr(_build, "_CACHE", {})
    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", _Resolver)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: made.append("c"))
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", lambda r: made.append("i"))
    monkeypatch.setattr(tf.distribute, "TPUStrategy", lambda r: ("TPUStrategy", r._tpu))
    monkeypatch.setattr(tpu_strategy_util, "_INITIALIZED_TPU_SYSTEMS", {"ready": object()})
    return made


def test_a_tpu_system_initialised_already_is_reused(calls: list[str]) -> None:
    strategy: Any = _build.connect_tpu("ready", probe_timeout=1.0)
    assert strategy == ("TPUStrategy", "ready")
    assert calls == []  # neither connected nor initialised again


def test_another_tpu_is_initialised(calls: list[str]) -> None:
    strategy: Any = _build.connect_tpu("fresh", probe_timeout=1.0)
    assert strategy == ("TPUStrategy", "fresh")
    assert calls == ["i"]
