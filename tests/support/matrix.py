"""The settings the interaction matrix crosses, as plain data. Pure (no TensorFlow)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Settings:
    """The users' settings a cell combines (the defaults: what the quick start has)."""

    seed: int | None = 1  # the global seed (keras.utils.set_random_seed), None: unseeded
    determinism: bool = False  # tf.config.experimental.enable_op_determinism()
    backup: bool = False  # keras.callbacks.BackupAndRestore beside the callback under test
    spe: int = 1  # steps_per_execution
    accumulation: int = 1  # gradient accumulation steps (1: none)
    mixed: bool = False  # mixed_float16
    validation: bool = False  # validation_data
    unknown_size: bool = False  # a from_generator source of unknown size
    replicas: int = 2

    def label(self) -> str:
        defaults = Settings()
        parts = [
            f"{field.name}={getattr(self, field.name)}"
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != getattr(defaults, field.name)
        ]
        return ",".join(parts) or "defaults"


FACTORS: dict[str, tuple[Any, ...]] = {
    "seed": (0, None, 1),
    "determinism": (False, True),
    "backup": (False, True),
    "spe": (1, 3),
    "accumulation": (1, 2),
    "mixed": (False, True),
    "validation": (False, True),
    "unknown_size": (False, True),
    "replicas": (1, 2),
}
