"""Graph pieces the tests share."""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf


def sleeping(x: Any, seconds: float) -> Any:
    """``x``, after a sleep of ``seconds`` inside the graph (a ``py_function``)."""

    def wait(value: Any) -> Any:
        time.sleep(seconds)
        return value

    y = tf.py_function(wait, [x], tf.float32)
    y.set_shape(x.shape)
    return y
