"""TensorFlow's coordination service key-value store: what the workers of a job share.

Every MultiWorkerMirroredStrategy job runs the service (its leader is worker 0); its store
answers while the collectives of a step wait or have been aborted. The preemption agreement,
the stuck-worker phases and the exit barrier all go through it. Pure at import: TensorFlow is
imported when the store is first used.
"""

from __future__ import annotations

from typing import Protocol

from tfdp_utils import _helper_calls


class KeyValueStore(Protocol):
    """The operations of TensorFlow's coordination service key-value store."""

    def set(self, key: str, value: str) -> None:
        """Set ``key``; raise if it exists."""

    def get(self, key: str, timeout_ms: int) -> str | None:
        """``key``'s value, or None when it is not set within ``timeout_ms``."""

    def delete(self, key: str) -> None:
        """Delete ``key`` (nothing happens when it is not set)."""


class CoordinationStore:
    """TensorFlow's coordination service as a :class:`KeyValueStore` (a blocking get releases
    the GIL). Imports TensorFlow when first used.

    Every MultiWorkerMirroredStrategy job runs the service; its store answers while the
    collectives of a step wait or have been aborted (it does not go through them).
    """

    def set(self, key: str, value: str) -> None:
        from tensorflow.python.eager import context

        with _helper_calls.call(f"a write of {key!r} to the coordination service"):
            context.context().set_config_key_value(key, value)

    def get(self, key: str, timeout_ms: int) -> str | None:
        from tensorflow.python.eager import context
        from tensorflow.python.framework import errors

        try:
            with _helper_calls.call(f"a read of {key!r} from the coordination service"):
                value = context.context().get_config_key_value(key, timeout_in_ms=timeout_ms)
        except errors.DeadlineExceededError:
            return None
        return str(value)

    def delete(self, key: str) -> None:
        """Delete ``key`` (nothing happens when it is not set)."""
        from tensorflow.python.eager import context

        with _helper_calls.call(f"a delete of {key!r} in the coordination service"):
            context.context().delete_config_key_value(key)
