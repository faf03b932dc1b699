"""tfdp-utils doctor: each self-test fails when its bug is planted, and the command says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from support.processes import REPO

from tfdp_utils import compat
from tfdp_utils._tf import IS_KERAS3, keras, tf
from tfdp_utils.callbacks import ThroughputLogger
from tfdp_utils.doctor import _checks as doctor_checks
from tfdp_utils.doctor import _command as doctor
from tfdp_utils.doctor._command import Check, DoctorOptions, exit_code, format_table

SELF_TESTS = (
    "2 replicas = 1 device",
    "2 replicas = 1 device, steps_per_execution=2",
    "builder: each example once",
    "ThroughputLogger counts",
)


def _strategy():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "tfdp_utils.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=str(REPO),
        env=full_env,
        check=False,
    )


# --------------------------------------------------------------------------------- pure


def test_version_checks_read_metadata_without_importing_tensorflow() -> None:
    code = (
        "import json, sys\n"
        "from tfdp_utils.doctor import _command as doctor\n"
        "checks = doctor.version_checks()\n"
        "print(json.dumps([c.as_dict() for c in checks]))\n"
        "print('tensorflow' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    checks_line, imported = result.stdout.strip().splitlines()
    assert imported == "False"
    names = [c["name"] for c in json.loads(checks_line)]
    assert {"Python", "TensorFlow package", "Keras", "tf_keras", "TensorBoard", "Ray"} <= set(names)


def _tensorboard_line(path: str) -> dict[str, Any]:
    """The doctor's tensorboard-command check, in a child process whose PATH is ``path``."""
    code = (
        "import json\n"
        "from tfdp_utils.doctor import _command as doctor\n"
        "checks = {c.name: c.as_dict() for c in doctor.version_checks()}\n"
        "print(json.dumps(checks['tensorboard command']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": path},
    )
    assert result.returncode == 0, result.stderr
    line: dict[str, Any] = json.loads(result.stdout)
    return line


def test_a_missing_tensorboard_command_is_reported_with_how_to_view_the_logs(
    tmp_path: Any,
) -> None:
    line = _tensorboard_line(str(tmp_path))  # an empty directory: no tensorboard on PATH
    assert line["status"] == "WARN"
    assert "not on PATH" in line["detail"]
    assert "tfdp-utils report LOGDIR" in line["detail"]
    assert "tfdp-utils[report]" in line["detail"]


def test_a_tensorboard_command_on_path_is_named(tmp_path: Any) -> None:
    command = tmp_path / "tensorboard"
    command.write_text("#!/bin/sh\n")
    command.chmod(0o755)
    line = _tensorboard_line(str(tmp_path))
    assert line["status"] == "INFO"
    assert line["detail"].startswith(str(command))


def test_two_tensorflow_flavours_at_once_are_flagged() -> None:
    assert doctor.flavour_check({}).status == "FAIL"
    assert doctor.flavour_check({"tensorflow-cpu": "2.21.0"}).status == "INFO"
    both = doctor.flavour_check({"tensorflow": "2.21.0", "tensorflow-cpu": "2.21.0"})
    assert both.status == "WARN"
    assert "tensorflow 2.21.0 + tensorflow-cpu 2.21.0" in both.detail
    assert "--no-deps" in both.detail


def test_two_keras_distributions_at_once_are_flagged() -> None:
    assert doctor.keras_check("Keras", {}).detail == "not installed"
    assert doctor.keras_check("Keras", {"keras": "3.15.1"}).detail == "3.15.1"
    nightly = doctor.keras_check("Keras", {"keras-nightly": "3.16.0.dev2026102704"})
    assert (nightly.status, nightly.detail) == ("INFO", "keras-nightly 3.16.0.dev2026102704")
    found = {"keras": "3.15.1", "keras-nightly": "3.16.0.dev2026102704"}
    both = doctor.keras_check("Keras", found, "keras-nightly")
    assert both.status == "WARN"
    assert "keras 3.15.1 + keras-nightly 3.16.0.dev2026102704" in both.detail
    assert "pip uninstall -y keras && pip install --force-reinstall --no-deps" in both.detail
    assert '"keras-nightly==3.16.0.dev2026102704"' in both.detail
    unknown = doctor.keras_check("tf_keras", {"tf-keras": "2.21.0", "tf-keras-nightly": "2.22.0"})
    assert unknown.status == "WARN" and "pip show tensorflow" in unknown.detail


def test_the_table_gives_one_verdict_per_line_and_the_exit_code() -> None:
    checks = [
        Check("versions", "Python", "INFO", "3.11"),
        Check("self-tests", "a", "PASS", "fine", seconds=1.25),
        Check("self-tests", "bb", "FAIL", "broken"),
    ]
    table = format_table(checks)
    assert "  PASS  a       fine (1.2 s)" in table
    assert "  FAIL  bb      broken" in table
    assert table.endswith("verdict: FAILED (1 FAIL, 1 PASS)")
    assert exit_code(checks) == 1 and exit_code(checks[:2]) == 0


def test_the_environment_check_is_the_one_auto_strategy_runs() -> None:
    from tfdp_utils.strategy._environment_check import check_environment

    assert [c.status for c in doctor.environment_checks({})] == ["PASS"]
    environ = {"TFDP_STRATEGY": "nonsense", "TF_CONFIG": "[", "TFDP_SERVICE_TIMEOUT": "1"}
    checks = doctor.environment_checks(environ)
    problems = check_environment(environ)
    assert [(c.status, c.detail) for c in checks] == [("FAIL", p.message) for p in problems]
    assert [c.name for c in checks] == [
        "environment variables: TF_CONFIG",
        "environment variables: TFDP_STRATEGY",
    ]


def test_a_multi_line_detail_stays_in_its_column() -> None:
    table = format_table([Check("versions", "x", "FAIL", "first line\nsecond line")])
    assert "\n  FAIL  x  first line\n           second line\n" in table


def test_wait_all_kills_every_process_at_the_first_failure_or_the_bound() -> None:
    def start(code: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", code], text=True)

    failing = [start("import sys; sys.exit(3)"), start("import time; time.sleep(120)")]
    assert doctor.wait_all(failing, timeout=60) == "process 0 exited with 3"
    assert failing[1].returncode is not None and failing[1].returncode < 0  # killed
    hung = [start("import time; time.sleep(120)")]
    assert doctor.wait_all(hung, timeout=0.5) == "still running after the 0.5 s bound"
    assert hung[0].returncode is not None


def test_a_child_past_its_bound_is_killed_and_reported() -> None:
    checks = doctor.run_doctor(DoctorOptions(timeout=0.5))
    failed = [c for c in checks if c.status == "FAIL"]
    assert [c.name for c in failed] == ["TensorFlow checks"]
    assert "still running after the 0.5 s bound; last finished: start-up" in failed[0].detail
    assert exit_code(checks) == 1


# ----------------------------------------------------- each self-test fails on its planted bug


class PerReplicaMeanModel(keras.Sequential):  # type: ignore[misc]
    """The doctor's model with the classic bug: the loss averaged over the per-replica batch."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            logits = self(x, training=True)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            )
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        return {"loss": loss}


def broken_doctor_model(steps_per_execution: int = 1):
    model = PerReplicaMeanModel(
        [
            keras.Input((doctor_checks.FEATURES,)),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(doctor_checks.CLASSES),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.2), steps_per_execution=steps_per_execution)
    return model


@pytest.mark.keras
def test_equivalence_self_test_passes_and_fails_on_a_per_replica_mean() -> None:
    strategy = _strategy()
    assert doctor_checks.check_equivalence(strategy).status == "PASS"
    broken = doctor_checks.check_equivalence(strategy, model_fn=broken_doctor_model)
    assert broken.status == "FAIL"
    assert "first divergent step 1" in broken.detail


@pytest.mark.keras
def test_builder_self_test_fails_on_a_builder_that_drops_the_last_partial_batch() -> None:
    strategy = _strategy()

    def dropping_builder(source, *, strategy, global_batch_size):
        dataset = tf.data.Dataset.from_tensor_slices(source).batch(
            global_batch_size, drop_remainder=True
        )
        return strategy.experimental_distribute_dataset(dataset)

    assert doctor_checks.check_builder(strategy).status == "PASS"
    broken = doctor_checks.check_builder(strategy, builder=dropping_builder)
    assert broken.status == "FAIL"
    missing = doctor_checks.NUM_EXAMPLES % doctor_checks.GLOBAL_BATCH
    assert f"{missing} missing, 0 repeated" in broken.detail


@pytest.mark.keras
def test_logger_self_test_fails_when_the_partial_step_counts_as_a_whole_batch() -> None:
    strategy = _strategy()
    assert doctor_checks.check_logger(strategy).status == "PASS"

    class Blind(ThroughputLogger):  # type: ignore[misc]
        # Does not look at what fit trains on: every step counted as a whole global batch.
        def bind_fit_data(self, x: Any) -> None:
            super().bind_fit_data(None)

    def nominal_batch(log_dir: str):
        return Blind(
            log_dir,
            global_batch_size=doctor_checks.GLOBAL_BATCH,
            log_every_n_steps=1,
            warmup_steps=0,
        )

    broken = doctor_checks.check_logger(strategy, logger_factory=nominal_batch)
    assert broken.status == "FAIL"
    assert "wrong runs" in broken.detail


@pytest.mark.skipif(not IS_KERAS3, reason="keras#19246 is a Keras 3 bug; tf_keras has no patch")
def test_steps_per_execution_self_test_fails_with_the_workaround_patched_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    strategy = _strategy()
    monkeypatch.setenv(compat.DISABLE_VARIABLE, "1")
    compat.undo("keras#19246")
    try:
        broken = doctor_checks.check_equivalence(strategy, steps_per_execution=2)
    finally:
        monkeypatch.delenv(compat.DISABLE_VARIABLE)
    assert broken.status == "FAIL"
    assert "You must feed a value for placeholder" in broken.detail
    assert doctor_checks.check_equivalence(strategy, steps_per_execution=2).status == "PASS"


@pytest.mark.keras
def test_doctor_exits_non_zero_when_a_self_test_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor_checks, "doctor_model", broken_doctor_model)
    checks = doctor.run_doctor(in_process=True)
    failed = {c.name for c in checks if c.status == "FAIL"}
    assert failed == set(SELF_TESTS[:2])  # the builder and logger tests do not train it
    assert exit_code(checks) == 1
    assert "verdict: FAILED" in format_table(checks)


# ------------------------------------------------------------------------ the real command


@pytest.mark.slow
@pytest.mark.keras
def test_doctor_json_with_cluster_and_accelerators() -> None:
    result = _doctor("--json", "--cluster", "--gpu", "--tpu")
    report = json.loads(result.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert result.returncode == report["exit_code"] == 0, result.stdout[-4000:]
    for name in (*SELF_TESTS, "2 workers (MultiWorkerMirrored) = 1 device"):
        assert checks[name]["status"] == "PASS", checks[name]
    assert {c["section"] for c in report["checks"]} == {"versions", "known issues", "self-tests"}
    assert "keras#19246" in checks and checks["keras#19246"]["url"].endswith("/19246")
    if not tf.config.list_physical_devices("GPU"):
        assert checks["GPU replicas"]["detail"] == "skipped: none present"
    if not tf.config.list_physical_devices("TPU") and not os.environ.get("TPU_NAME"):
        assert checks["TPU replicas"]["detail"] == "skipped: none present"


def test_doctor_fails_with_the_keras_workarounds_turned_off() -> None:
    result = _doctor(env={compat.DISABLE_VARIABLE: "1"})
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    failed = [line for line in lines if line.startswith("  FAIL")]
    assert len(failed) == 1 and "steps_per_execution=2" in failed[0], result.stdout
    assert "placeholder" in failed[0]
    assert any(line.startswith("  WARN  keras#19246") for line in lines)
    assert lines[-1].startswith("verdict: FAILED (1 FAIL")


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"TFDP_STRATEGY": "nonsense"}, "TFDP_STRATEGY='nonsense' is not a strategy choice"),
        ({"TF_CONFIG": "["}, "TF_CONFIG is invalid: it is not valid JSON"),
        ({"TFDP_COLLECTIVE_TIMEOUT": "-1"}, "TFDP_COLLECTIVE_TIMEOUT=-1.0 must be a positive"),
        ({"TFDP_EXIT_GRACE": "abc"}, "TFDP_EXIT_GRACE must be a number of seconds, but received"),
    ],
)
def test_doctor_fails_on_an_environment_auto_strategy_refuses(
    variables: dict[str, str], named: str
) -> None:
    # Before: TFDP_STRATEGY=nonsense gave "verdict: OK", exit 0; a malformed TF_CONFIG failed
    # in the child process with a raw JSONDecodeError that never named TF_CONFIG.
    result = _doctor(env=variables)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    [failed] = [line for line in lines if line.startswith("  FAIL")]
    assert "environment variables: " + next(iter(variables)) in failed
    assert named in failed
    assert "JSONDecodeError" not in result.stdout + result.stderr
    assert any(line.startswith("  SKIP  TensorFlow checks") for line in lines)
    assert lines[-1].startswith("verdict: FAILED (1 FAIL")


@pytest.mark.parametrize(("replicas", "batch"), [(1, 8), (2, 8), (3, 9), (5, 10), (8, 8)])
def test_the_self_test_batches_split_over_any_number_of_replicas(replicas: int, batch: int) -> None:
    from tfdp_utils.doctor._checks import EQUIVALENCE_STEPS, whole_batches

    sizes = [int(x.shape[0]) for x, _ in whole_batches(replicas)]
    assert sizes == [batch] * EQUIVALENCE_STEPS
