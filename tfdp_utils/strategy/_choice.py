"""``auto_strategy()``: pick a ``tf.distribute`` strategy, explain why, and never hang.

The decision (:func:`choose_strategy`) is a pure function of an :class:`Environment`;
:func:`auto_strategy` detects the environment, bounds every probe that can wait on the
network, and builds the strategy.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from tfdp_utils import _dataset_info as dataset_info
from tfdp_utils import _validate, _variables
from tfdp_utils._public import public
from tfdp_utils._validate import positive_float
from tfdp_utils.cluster._config import ClusterConfig
from tfdp_utils.cluster._topology import position_of
from tfdp_utils.errors import TPUProbeError
from tfdp_utils.strategy._build import (
    DEFAULT_CLUSTER_TIMEOUT,
    build_strategy,
    config_from_resolver,
    connect_tpu,
    resolve_cluster_timeout,
)
from tfdp_utils.strategy._collective_bound import (
    DEFAULT_COLLECTIVE_TIMEOUT,
    resolve_collective_timeout,
)
from tfdp_utils.strategy._detect import Environment, detect_environment
from tfdp_utils.strategy._environment_check import check_prefer as _check_prefer
from tfdp_utils.strategy._environment_check import raise_first_problem
from tfdp_utils.strategy._resuming import checked_directory, resume_reason
from tfdp_utils.strategy._strategy_choice import StrategyChoice, StrategyKind
from tfdp_utils.strategy._xla import keras_xla

logger = logging.getLogger("tfdp_utils")


def normalize_device(name: str) -> str:
    """``"/gpu:0"``, ``"GPU:0"`` or ``"/job:localhost/device:GPU:0"`` -> ``"/device:GPU:0"``."""
    text = _validate.text(name, "device", hint="Name devices like '/gpu:0'.").strip()
    tail = text.rsplit("/", 1)[-1]
    if tail.lower().startswith("device:"):
        tail = tail[len("device:") :]
    kind, sep, index = tail.partition(":")
    if not sep or not index.isdigit() or not kind:
        raise ValueError(
            f"device {name!r} is not a device name; expected something like '/gpu:0' or "
            "'/device:CPU:1'."
        )
    return f"/device:{kind.upper()}:{int(index)}"


def _restrict(env: Environment, devices: Sequence[str]) -> tuple[str, ...]:
    if isinstance(devices, str):
        raise TypeError(f"devices={devices!r} is a string; pass a list such as ['{devices}'].")
    if not devices:
        raise ValueError("devices=[] names no device; pass None to use every visible device.")
    available = (*env.tpus, *env.gpus, *env.cpus)
    chosen = tuple(normalize_device(d) for d in devices)
    missing = [d for d in chosen if d not in available]
    if missing:
        raise ValueError(
            f"devices {missing} are not visible to this process; visible devices are "
            f"{list(available)}. Check CUDA_VISIBLE_DEVICES or the logical device configuration."
        )
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"devices={list(devices)} names a device twice.")
    return chosen


def _local_choice(env: Environment, devices: tuple[str, ...] | None, why: str) -> StrategyChoice:
    if devices is not None:
        kind: StrategyKind = "mirrored" if len(devices) > 1 else "one_device"
        return StrategyChoice(kind, devices, f"{why}devices={list(devices)} given -> {kind}")
    if len(env.gpus) >= 2:
        return StrategyChoice(
            "mirrored", env.gpus, f"{why}{len(env.gpus)} GPUs visible -> mirrored"
        )
    if len(env.cpus) >= 2 and not env.gpus:
        return StrategyChoice(
            "mirrored",
            env.cpus,
            f"{why}no GPU, {len(env.cpus)} logical CPU devices configured -> mirrored",
        )
    if env.gpus:
        return StrategyChoice("one_device", env.gpus[:1], f"{why}1 GPU visible -> one_device")
    return StrategyChoice("one_device", env.cpus[:1], f"{why}no GPU or TPU, CPU only -> one_device")


@public("tfdp_utils")
def choose_strategy(
    env: Environment,
    *,
    prefer: str = "auto",
    devices: Sequence[str] | None = None,
    tpu_failure: str | None = None,
) -> StrategyChoice:
    """Decide which strategy ``env`` calls for. Pure: no TensorFlow, no I/O.

    Order for ``prefer="auto"``: TPU when evidently present, then a multi-task cluster
    (MultiWorkerMirroredStrategy), then 2+ GPUs or 2+ logical CPUs (MirroredStrategy), then
    one GPU, then the CPU (OneDeviceStrategy). ``env.forced_strategy`` (``TFDP_STRATEGY``)
    replaces ``"auto"``. In a cluster with ``ps`` tasks the chief (the coordinator) gets
    ``parameter_server``, an evaluator gets a local strategy, and the ``worker`` and ``ps``
    tasks get an error: they run :func:`run_server` instead of training.

    Args:
        env: what the process sees; see :func:`detect_environment`.
        prefer: ``"auto"``, ``"tpu"``, ``"multi_worker"``, ``"mirrored"``, ``"one_device"``
            or ``"parameter_server"``. Defaults to `"auto"`.
        devices: restrict to these local devices. Defaults to `None` (all visible).
        tpu_failure: why a TPU probe failed; the TPU is then skipped and the reason kept.
            Defaults to `None`.

    Returns:
        A :class:`StrategyChoice`.

    Raises:
        ValueError: for an unknown ``prefer`` or ``TFDP_STRATEGY``, unknown devices, a
            ``worker`` or ``ps`` task of a parameter-server cluster, a parameter-server
            cluster without a chief, or ``prefer="parameter_server"`` without ``ps`` tasks.
    """
    if not isinstance(env, Environment):
        raise TypeError(
            f"env must be an Environment (from tdu.detect_environment()), but received {env!r} "
            f"of type {type(env).__name__}."
        )
    prefer, why = _resolve_prefer(env, prefer)
    chosen = _restrict(env, devices) if devices is not None else None
    cluster = env.cluster
    if prefer == "parameter_server" and (cluster is None or not cluster.has_parameter_servers):
        where = cluster.describe() if cluster else "no cluster spec"
        raise ValueError(
            f"prefer='parameter_server' needs a cluster with 'ps' tasks, but there is {where}. "
            "Set TF_CONFIG with 'chief', 'worker' and 'ps' tasks, or use prefer='auto'."
        )
    if cluster is not None and cluster.has_parameter_servers:
        ps_choice = _parameter_server_choice(cluster, prefer, why)
        if ps_choice is not None:
            return ps_choice
        why += "evaluator task trains nothing, so it runs alone; "
        return _local_choice(env, chosen, why)
    if prefer != "auto":
        return _preferred_choice(env, prefer, chosen, why)
    return _auto_choice(env, chosen, why, tpu_failure)


def _resolve_prefer(env: Environment, prefer: str) -> tuple[str, str]:
    """``(prefer, why)``: the checked preference, ``TFDP_STRATEGY``'s in place of ``"auto"``,
    and the start of the reason that says so."""
    prefer = _check_prefer(prefer, "prefer")
    why = ""
    if prefer == "auto" and env.forced_strategy:
        prefer = _check_prefer(env.forced_strategy, _variables.STRATEGY)
        if prefer != "auto":
            why = f"TFDP_STRATEGY={prefer}; "
    return prefer, why


def _preferred_choice(
    env: Environment, prefer: str, chosen: tuple[str, ...] | None, why: str
) -> StrategyChoice:
    """The strategy ``prefer`` names outside a parameter-server cluster: ``"tpu"``,
    ``"multi_worker"``, ``"mirrored"`` or ``"one_device"``."""
    cluster = env.cluster
    if prefer == "tpu":
        tpu_devices = chosen or env.tpus
        return StrategyChoice("tpu", tpu_devices, f"{why}prefer='tpu' -> tpu")
    if prefer == "multi_worker":
        local = chosen or (env.gpus or env.cpus[:1])
        detail = cluster.describe() if cluster else "no cluster spec, so a single worker"
        return StrategyChoice("multi_worker", local, f"{why}{detail} -> multi_worker", cluster)
    if prefer == "mirrored":
        local = chosen or (env.gpus or env.cpus)
        return StrategyChoice("mirrored", local, f"{why}prefer='mirrored' -> mirrored")
    # prefer == "one_device" ("parameter_server" is settled with the cluster's 'ps' tasks)
    local = chosen or (env.gpus or env.cpus)[:1]
    if len(local) != 1:
        raise ValueError(
            f"one_device needs exactly one device; devices={list(local)} has {len(local)}."
        )
    return StrategyChoice("one_device", local, f"{why}prefer='one_device' -> one_device")


def _auto_choice(
    env: Environment, chosen: tuple[str, ...] | None, why: str, tpu_failure: str | None
) -> StrategyChoice:
    """``prefer="auto"``: a TPU in evidence, then a multi-task cluster, then local devices."""
    cluster = env.cluster
    if tpu_failure:
        why += f"{tpu_failure}; "
    elif env.tpus or env.tpu_hint:
        evidence = env.tpu_hint or f"{len(env.tpus)} local TPU device(s)"
        return StrategyChoice("tpu", chosen or env.tpus, f"{why}{evidence} -> tpu")
    if cluster is not None:
        if cluster.worker_rank is None:
            why += f"{cluster.task_type} task trains nothing, so it runs alone; "
        elif cluster.num_workers > 1:
            local = chosen or (env.gpus or env.cpus[:1])
            return StrategyChoice(
                "multi_worker", local, f"{why}{cluster.describe()} -> multi_worker", cluster
            )
        else:
            why += f"{cluster.source} lists a single training task; "
    return _local_choice(env, chosen, why)


def _parameter_server_choice(
    cluster: ClusterConfig, prefer: str, why: str
) -> StrategyChoice | None:
    """The chief's choice in a cluster with ``ps`` tasks; None for the evaluator."""
    me = f"{cluster.task_type}:{cluster.task_index}"
    if cluster.task_type == "evaluator":
        return None
    if "chief" not in cluster.cluster:
        raise ValueError(
            f"the {cluster.source} cluster has 'ps' tasks but no 'chief': parameter-server "
            "training needs one chief task that coordinates the workers. Add "
            '"chief": ["host:port"] to the cluster, or remove \'ps\' to train with '
            "MultiWorkerMirroredStrategy."
        )
    if cluster.task_type != "chief":
        raise ValueError(
            f"this task is {me} of a parameter-server cluster ({cluster.describe()}): "
            f"{cluster.task_type} tasks do not build a strategy or train; they serve the chief. "
            "Call tfdp_utils.run_server() in this task instead (it blocks), e.g.\n"
            "    if tdu.cluster_task_type() in ('worker', 'ps'):\n"
            "        tdu.run_server()\n"
            "    strategy = tdu.auto_strategy()"
        )
    if prefer not in ("auto", "parameter_server"):
        raise ValueError(
            f"prefer={prefer!r} cannot train a cluster with 'ps' tasks ({cluster.describe()}); "
            "use prefer='auto' or 'parameter_server', or remove 'ps' from the cluster."
        )
    return StrategyChoice(
        "parameter_server", (), f"{why}{cluster.describe()} -> parameter_server", cluster
    )


@public("tfdp_utils")
def auto_strategy(
    prefer: str = "auto",
    *,
    devices: Sequence[str] | None = None,
    tpu: str | None = None,
    cluster_resolver: Any = None,
    cross_device_ops: Any = None,
    probe_timeout: float = 5.0,
    cluster_timeout: float = DEFAULT_CLUSTER_TIMEOUT,
    collective_timeout: float | None = DEFAULT_COLLECTIVE_TIMEOUT,
    resume_from: str | os.PathLike[str] | None = None,
    verbose: bool = True,
) -> Any:
    """Pick, build and return the ``tf.distribute.Strategy`` this process should train with.

    TPU > multi-worker cluster > multi-GPU (or several logical CPUs) > one device. Each choice
    is logged once (logger ``tfdp_utils``) with its reason. Nothing here waits unbounded: a TPU
    probe gives up after ``probe_timeout`` seconds and falls back (under ``"auto"``), peers of
    a cluster must answer within ``cluster_timeout`` seconds, and a multi-worker job's calls
    that wait on a peer end after ``collective_timeout`` seconds. The cluster comes from
    TF_CONFIG (Kubernetes TFJob, Ray Train) or srun's variables (SLURM); an ``evaluator`` task
    gets a local strategy, and the chief of a cluster with ``ps`` tasks gets
    ``ParameterServerStrategy`` (tf_keras only; see :func:`run_server` for the other tasks).

    Args:
        prefer: ``"auto"``, ``"tpu"``, ``"multi_worker"``, ``"mirrored"`` or ``"one_device"``.
            The environment variable ``TFDP_STRATEGY`` overrides ``"auto"``. Defaults to `"auto"`.
        devices: restrict to these local devices, as MirroredStrategy's argument does.
            Defaults to `None` (every visible device).
        tpu: TPU name or ``grpc://`` address for ``TPUClusterResolver``. Defaults to `None`.
        cluster_resolver: a ``tf.distribute.cluster_resolver.ClusterResolver`` to use instead
            of TF_CONFIG / SLURM. Defaults to `None`.
        cross_device_ops: passed to MirroredStrategy. Defaults to `None`.
        probe_timeout: seconds allowed for each TPU probe step. Defaults to `5.0`.
        cluster_timeout: seconds to wait for every peer of a cluster to start, counted from
            when this call starts waiting for them: after TensorFlow's import and the device
            listing inside the call, which can take tens of seconds on their own, so the
            timeout error says both how long it waited and how long the call had taken. The
            variable ``TFDP_CLUSTER_TIMEOUT`` replaces the default. Defaults to `300.0`.
        collective_timeout: seconds one TensorFlow call of a multi-worker job may wait (a
            collective whose peer is stuck or gone); past it, the job's collectives are
            aborted and ``fit`` raises ``tf.errors.DeadlineExceededError`` with a message
            naming this bound (see :class:`tfdp_utils.strategy.CollectiveWatchdog`). A dead peer
            is usually reported sooner by TensorFlow itself (``UnavailableError``). Keep it above
            your slowest step, first trace and save. The variable ``TFDP_COLLECTIVE_TIMEOUT``
            replaces the default; None or 0 turns the bound off. Defaults to `600.0`.
        resume_from: the ``PreemptionCheckpoint`` directory the job resumes from. When its
            latest checkpoint was saved on another number of workers or replicas, the reason
            line says so (``"resuming a 4-worker job on 2 (...)"``, an elastic resume) and
            whether the global batch still divides over the new replicas. Nothing is restored
            here; a missing or empty directory (a first run) adds nothing. Defaults to `None`.
        verbose: show the one-line explanation (what was built and why). It is logged at INFO
            on the ``tfdp_utils`` logger; when no logging set-up would show that, it is printed
            to stderr instead. False, or a level set on the ``tfdp_utils`` logger, silences it.
            Defaults to `True`.

    Returns:
        A ``tf.distribute.Strategy``. Calling again returns an equivalent strategy (the same
        instance for multi-worker and TPU strategies, which TensorFlow allows once per process).

    Raises:
        ValueError: unknown ``prefer``, unknown devices, a bad ``collective_timeout``, a
            parameter-server cluster under Keras 3 or on a ``worker`` / ``ps`` task; or an
            environment variable tfdp-utils reads that is malformed (TF_CONFIG, ``SLURM_*``,
            ``TFDP_STRATEGY``, ``TFDP_*_TIMEOUT``, ``TFDP_SLURM_PORT_BASE``,
            ``TFDP_EXIT_GRACE``), checked first, before TensorFlow is imported, with the
            message ``tfdp-utils env`` and ``doctor`` print for the same environment.
        ClusterTimeoutError: peers did not start within ``cluster_timeout``.
        TPUProbeError: ``prefer="tpu"`` and the TPU could not be reached.

    Examples:
        >>> strategy = auto_strategy()  # doctest: +SKIP
        >>> with strategy.scope():  # doctest: +SKIP
        ...     model = build_model()
    """
    called_at = time.monotonic()  # bounds' messages say how long the call took before them
    probe_timeout = positive_float(probe_timeout, "probe_timeout", unit="number of seconds")
    if tpu is not None:
        _validate.text(tpu, "tpu", hint="Pass a TPU name or a 'grpc://host:port' address.")
    # The same check as `tfdp-utils env` and `doctor`, before TensorFlow is imported.
    raise_first_problem()
    resume_directory = checked_directory(resume_from)
    resolved_collective_timeout = resolve_collective_timeout(collective_timeout)
    cluster_timeout = resolve_cluster_timeout(cluster_timeout)
    env, prefer = _detect(tpu, cluster_resolver, prefer)
    choice = choose_strategy(env, prefer=prefer, devices=devices)
    strategy: Any = None
    if choice.kind == "tpu":
        strategy, choice = _connect_tpu_or_fall_back(
            env, choice, prefer=prefer, devices=devices, probe_timeout=probe_timeout
        )
    if strategy is None:
        strategy = build_strategy(
            choice,
            cluster_resolver=cluster_resolver,
            cross_device_ops=cross_device_ops,
            cluster_timeout=cluster_timeout,
            collective_timeout=resolved_collective_timeout,
            num_gpus=len(env.gpus),
            called_at=called_at,
        )
    choice = _with_resume_reason(choice, strategy, resume_directory)
    _settle(strategy, choice, env, verbose=verbose)
    return strategy


def _with_resume_reason(
    choice: StrategyChoice, strategy: Any, directory: str | None
) -> StrategyChoice:
    """``choice`` with the elastic resume said in its reason, when ``directory``'s latest
    checkpoint was saved on another shape than ``strategy``'s."""
    if directory is None:
        return choice
    replicas = int(strategy.num_replicas_in_sync)
    clause = resume_reason(directory, position_of(strategy).num_workers, replicas)
    if clause is None:
        return choice
    return dataclasses.replace(choice, reason=f"{choice.reason}; {clause}")


def _detect(tpu: str | None, cluster_resolver: Any, prefer: str) -> tuple[Environment, str]:
    """``(env, prefer)``: what this process sees, with ``cluster_resolver``'s cluster when one
    is given (a resolver that names no cluster asks for one worker: ``multi_worker``)."""
    env = detect_environment(tpu=tpu)
    if cluster_resolver is not None:
        config = config_from_resolver(cluster_resolver)
        env = dataclasses.replace(env, cluster=config)
        if prefer == "auto" and not env.forced_strategy and config is None:
            prefer = "multi_worker"
    return env, prefer


def _connect_tpu_or_fall_back(
    env: Environment,
    choice: StrategyChoice,
    *,
    prefer: str,
    devices: Sequence[str] | None,
    probe_timeout: float,
) -> tuple[Any, StrategyChoice]:
    """``(strategy, choice)`` for a TPU ``choice``: the TPU strategy and ``choice``, or, when
    the probe fails under ``"auto"``, None and the choice made without the TPU.

    Raises:
        TPUProbeError: when the TPU was asked for (``prefer`` or ``TFDP_STRATEGY``).
    """
    try:
        return connect_tpu(env.tpu_address, probe_timeout), choice
    except Exception as exc:
        if env.tpu_hint or env.tpus:
            evidence = env.tpu_hint or f"{len(env.tpus)} local TPU device(s)"
            failure = f"TPU evidence ({evidence}) but probe failed: {exc}"
        else:
            failure = (
                "a TPU was asked for, but this process sees no TPU (no local TPU devices, "
                f"no TPU_NAME / COLAB_TPU_ADDR / TPU address) and the probe failed: {exc}"
            )
        if _check_prefer(prefer, "prefer") == "tpu" or env.forced_strategy == "tpu":
            raise TPUProbeError(
                f"{failure}. Check the TPU name/address, or pass probe_timeout=SECONDS to wait "
                "longer, or prefer='auto' to fall back to other devices."
            ) from exc
        logger.warning("tfdp_utils: %s; falling back", failure)
        return None, choose_strategy(env, prefer=prefer, devices=devices, tpu_failure=failure)


def _settle(strategy: Any, choice: StrategyChoice, env: Environment, *, verbose: object) -> None:
    """After the build: warn of a multi-worker strategy without a cluster, apply the Keras
    workarounds and the exit guard, announce the choice, and record it for ``explain``."""
    if choice.kind == "multi_worker" and choice.cluster is None:
        logger.warning(
            "tfdp_utils: prefer='multi_worker' but no cluster is configured (no TF_CONFIG, no "
            "srun task variables): MultiWorkerMirroredStrategy over this one worker, which "
            "trains like MirroredStrategy. Set TF_CONFIG (or run under srun) on every worker "
            "to train on several machines."
        )
    from tfdp_utils import compat
    from tfdp_utils.compat import _changes

    compat.apply_for_strategy(strategy)  # the Keras workarounds this strategy needs
    _changes.guard_exits(applied_by="auto_strategy()")  # a crashed job always ends
    where = ", ".join(choice.devices) or ("the cluster" if choice.cluster else "TPU")
    from tfdp_utils._tf import IS_KERAS3

    xla = keras_xla(choice.kind, keras3=IS_KERAS3, accelerators=len(env.gpus) + len(env.tpus))
    _announce(
        f"tfdp_utils: {choice.class_name} over {strategy.num_replicas_in_sync} replica(s) on "
        f"{where}: {choice.reason}. {xla}",
        verbose=_validate.boolean(verbose, "verbose"),
    )
    from tfdp_utils.compat import _changes as compat_changes  # listed by tdu.compat.status()

    compat_changes.record_strategy_choice(strategy, choice, applied_by="auto_strategy()")
    dataset_info.record_strategy(strategy)


def _info_is_shown() -> bool:
    """Whether an INFO record of the ``tfdp_utils`` logger reaches some handler."""
    if not logger.isEnabledFor(logging.INFO):
        return False
    node: logging.Logger | None = logger
    while node is not None:
        if any(handler.level <= logging.INFO for handler in node.handlers):
            return True
        node = node.parent if node.propagate else None
    return False


def _announce(line: str, *, verbose: bool) -> None:
    """Log the one-line explanation at INFO, and print it when no logging set-up would show it.

    The user's logging configuration is left alone: a script that configured logging sees the
    line there (once); one that did not sees it on stderr; ``verbose=False``, or a level set on
    the ``tfdp_utils`` logger (e.g. WARNING), silences it.
    """
    logger.info("%s", line)
    if verbose and logger.level == logging.NOTSET and not _info_is_shown():
        print(line, file=sys.stderr, flush=True)


@public("tfdp_utils.strategy")
def explain(strategy: Any) -> StrategyChoice | None:
    """The :class:`StrategyChoice` behind a strategy from :func:`auto_strategy`, if any."""
    return getattr(strategy, "_tfdp_choice", None)
