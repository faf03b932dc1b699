"""Whether Keras will compile a model with XLA under a strategy: a pure decision.

Keras 3 (TensorFlow backend) resolves ``compile(jit_compile="auto")`` to XLA only when a GPU
or TPU is visible *and* the model was built outside any tf.distribute strategy
(``Trainer._resolve_auto_jit_compile``): under MirroredStrategy or MultiWorkerMirroredStrategy
it silently trains without XLA. tf_keras compiles with XLA only for ``jit_compile=True``.
TPUStrategy always compiles with XLA. :func:`tfdp_utils.auto_strategy` states the verdict in
its one-line explanation; :func:`tfdp_utils.make_distributed_train_step` takes ``jit_compile``
itself.
"""

from __future__ import annotations


def keras_xla(kind: str, *, keras3: bool, accelerators: int) -> str:
    """One sentence: does ``fit`` compile with XLA under a strategy of ``kind``? Pure.

    Args:
        kind: the strategy kind (``StrategyChoice.kind``): ``"tpu"``, ``"mirrored"``, ...
        keras3: whether the active Keras is Keras 3 (else tf_keras).
        accelerators: GPUs (or TPU cores) visible to this process.

    Returns:
        e.g. ``"Keras fit: no XLA (jit_compile='auto' is off under tf.distribute; pass
        jit_compile=True to compile)"``.

    Examples:
        >>> keras_xla("one_device", keras3=True, accelerators=0)
        "Keras fit: no XLA (jit_compile='auto' is off on CPU only)"
    """
    if kind == "tpu":
        return "Keras fit: XLA (TPUStrategy always compiles with XLA)"
    if not keras3:
        return "Keras fit: XLA only with compile(jit_compile=True) (tf_keras's default is off)"
    if accelerators == 0:
        return "Keras fit: no XLA (jit_compile='auto' is off on CPU only)"
    return (
        "Keras fit: no XLA (jit_compile='auto' is off under tf.distribute; pass "
        "compile(jit_compile=True) to compile)"
    )
