"""``auto_strategy()``: pick a ``tf.distribute`` strategy, explain why, and never hang.

The decision (:func:`choose_strategy`) is a pure function of an :class:`Environment`;
:func:`auto_strategy` detects the environment, bounds every probe that can wait on the
network, and builds the strategy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any, Literal

from tfdp_utils import dataset_info
from tfdp_utils._validate import env_seconds, positive_float
from tfdp_utils.cluster import ClusterConfig, wait_for_peers, wait_for_servers
from tfdp_utils.environment import Environment, detect_environment
from tfdp_utils.faults import (
    COLLECTIVE_TIMEOUT_VARIABLE,
    DEFAULT_COLLECTIVE_TIMEOUT,
    CollectiveWatchdog,
    resolve_collective_timeout,
)
from tfdp_utils.topology import is_multi_worker

logger = logging.getLogger("tfdp_utils")

StrategyKind = Literal["tpu", "multi_worker", "mirrored", "one_device", "parameter_server"]
STRATEGY_KINDS: tuple[str, ...] = (
    "tpu",
    "multi_worker",
    "mirrored",
    "one_device",
    "parameter_server",
)
PREFER_CHOICES: tuple[str, ...] = ("auto", *STRATEGY_KINDS)

DEFAULT_CLUSTER_TIMEOUT = 300.0
CLUSTER_TIMEOUT_VARIABLE = "TFDP_CLUSTER_TIMEOUT"
# Group keys set aside for each MirroredStrategy built here (a strategy uses a handful).
_COLLECTIVE_KEY_STRIDE = 10_000

_CLASS_NAMES = {
    "tpu": "TPUStrategy",
    "multi_worker": "MultiWorkerMirroredStrategy",
    "mirrored": "MirroredStrategy",
    "one_device": "OneDeviceStrategy",
    "parameter_server": "ParameterServerStrategy",
}


class TPUProbeError(RuntimeError):
    """A TPU was asked for explicitly but could not be reached within the probe timeout."""


@dataclasses.dataclass(frozen=True)
class StrategyChoice:
    """The outcome of :func:`choose_strategy`.

    Attributes:
        kind: ``"tpu"``, ``"multi_worker"``, ``"mirrored"``, ``"one_device"`` or
            ``"parameter_server"`` (the chief of a cluster with ``ps`` tasks).
        devices: the local devices the strategy runs on.
        reason: one line saying why, e.g. ``"2 GPUs visible, no cluster -> mirrored"``.
        cluster: the cluster for ``multi_worker`` and ``parameter_server``, else None.
    """

    kind: StrategyKind
    devices: tuple[str, ...]
    reason: str
    cluster: ClusterConfig | None = None

    @property
    def class_name(self) -> str:
        """The ``tf.distribute`` class this choice builds."""
        return _CLASS_NAMES[self.kind]


def normalize_device(name: str) -> str:
    """``"/gpu:0"``, ``"GPU:0"`` or ``"/job:localhost/device:GPU:0"`` -> ``"/device:GPU:0"``."""
    text = name.strip()
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


def _check_prefer(prefer: str, source: str) -> str:
    value = prefer.strip().lower() if isinstance(prefer, str) else prefer
    if value not in PREFER_CHOICES:
        raise ValueError(
            f"{source}={prefer!r} is not a strategy choice; expected one of "
            f"{', '.join(repr(c) for c in PREFER_CHOICES)}."
        )
    return str(value)


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
    prefer = _check_prefer(prefer, "prefer")
    why = ""
    if prefer == "auto" and env.forced_strategy:
        prefer = _check_prefer(env.forced_strategy, "TFDP_STRATEGY")
        if prefer != "auto":
            why = f"TFDP_STRATEGY={prefer}; "
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
    if prefer == "one_device":
        local = chosen or (env.gpus or env.cpus)[:1]
        if len(local) != 1:
            raise ValueError(
                f"one_device needs exactly one device; devices={list(local)} has {len(local)}."
            )
        return StrategyChoice("one_device", local, f"{why}prefer='one_device' -> one_device")

    # prefer == "auto"
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


# ------------------------------------------------------------------------------- the glue

_CACHE: dict[tuple[Any, ...], Any] = {}
_CACHE_LOCK = threading.Lock()


def _cluster_timeout(value: float) -> float:
    override = os.environ.get(CLUSTER_TIMEOUT_VARIABLE)
    name = "cluster_timeout"
    if override and value == DEFAULT_CLUSTER_TIMEOUT:
        name = CLUSTER_TIMEOUT_VARIABLE
        value = env_seconds(name, override, example=DEFAULT_CLUSTER_TIMEOUT)
    return positive_float(value, name, unit="number of seconds")


def _call_with_timeout(fn: Any, timeout: float, what: str) -> Any:
    """Run ``fn()`` in a daemon thread; raise TimeoutError if it has not returned in time.

    Only for calls that release the GIL while waiting (Python sockets / urllib do).
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"tfdp-probe-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not answer within probe_timeout={timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _connect_tpu(address: str | None, probe_timeout: float) -> Any:
    """Resolve, reach and initialise a TPU, each networked step bounded by ``probe_timeout``."""
    from tfdp_utils._tf import tf
    from tfdp_utils.cluster import reachable

    key = ("tpu", address)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    resolver = _call_with_timeout(
        lambda: tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address or None),
        probe_timeout,
        "TPU resolver (GCE metadata server)",
    )
    master = str(resolver.master() or "")
    if master.startswith("grpc://"):
        target = master[len("grpc://") :]
        if not reachable(target, probe_timeout):
            raise TimeoutError(
                f"TPU worker {target} did not accept a connection within "
                f"probe_timeout={probe_timeout:g} s"
            )
        tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
    with _CACHE_LOCK:
        _CACHE[key] = strategy
    return strategy


def _communication_options(devices: Sequence[str]) -> Any:
    # No timeout_seconds here: TensorFlow starts one sleeping thread per collective for the
    # whole timeout (thousands of threads in a long run); CollectiveWatchdog bounds instead.
    from tfdp_utils._tf import tf

    implementation = (
        tf.distribute.experimental.CommunicationImplementation.NCCL
        if any(":GPU:" in d for d in devices)
        else tf.distribute.experimental.CommunicationImplementation.RING
    )
    return tf.distribute.experimental.CommunicationOptions(implementation=implementation)


def _resolver_for(config: ClusterConfig, num_gpus: int) -> Any:
    from tfdp_utils._tf import tf

    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({k: list(v) for k, v in config.cluster.items()}),
        task_type=config.task_type,
        task_id=config.task_index,
        rpc_layer="grpc",
        num_accelerators={"GPU": num_gpus} if num_gpus else None,
    )


def _config_from_resolver(resolver: Any) -> ClusterConfig | None:
    from tfdp_utils.cluster import validate_cluster

    spec = resolver.cluster_spec().as_dict()
    if not spec:
        return None
    return validate_cluster(
        spec, resolver.task_type, resolver.task_id, source=type(resolver).__name__
    )


def _build_multi_worker(
    choice: StrategyChoice,
    *,
    cluster_resolver: Any,
    cluster_timeout: float,
    collective_timeout: float | None,
    num_gpus: int,
) -> Any:
    from tfdp_utils._tf import tf

    config = choice.cluster
    if cluster_resolver is not None:
        config = _config_from_resolver(cluster_resolver)
    resolver = cluster_resolver
    if resolver is None and config is not None:
        resolver = _resolver_for(config, num_gpus)
    spec = json.dumps(config.as_tf_config(), sort_keys=True) if config else None
    key = ("multi_worker", spec, choice.devices, collective_timeout)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    if config is not None and config.num_workers > 1:
        # MWMS's constructor waits forever for a missing worker and cannot be interrupted
        # (the call holds the GIL, SIGTERM is ignored), so bound the wait before calling it.
        wait_for_peers(config, timeout=cluster_timeout)
    options = _communication_options(choice.devices)
    if resolver is None:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
    if collective_timeout is not None and is_multi_worker(strategy):
        CollectiveWatchdog(collective_timeout).start()  # its thread keeps it alive
        logger.info(
            "tfdp_utils: multi-worker calls are bounded by collective_timeout=%g s (change it "
            "with auto_strategy(collective_timeout=SECONDS) or %s)",
            collective_timeout,
            COLLECTIVE_TIMEOUT_VARIABLE,
        )
    with _CACHE_LOCK:
        _CACHE[key] = strategy
    return strategy


def _build_parameter_server(
    choice: StrategyChoice, *, cluster_resolver: Any, cluster_timeout: float, num_gpus: int
) -> Any:
    from tfdp_utils._tf import IS_KERAS3, KERAS_VERSION, tf

    if IS_KERAS3:
        # Keras 3's TensorFlow trainer has no ParameterServerStrategy path (tf_keras drives
        # it through a ClusterCoordinator inside Model.fit), so refuse before any network wait.
        raise ValueError(
            f"this is the chief of a parameter-server cluster, but the active Keras is Keras "
            f"{KERAS_VERSION}, whose Model.fit cannot train with ParameterServerStrategy. "
            "Set TF_USE_LEGACY_KERAS=1 (with tf-keras installed: pip install "
            "'tfdp-utils[legacy]') before TensorFlow is imported to train with tf_keras, or "
            "remove 'ps' from the cluster to train with MultiWorkerMirroredStrategy."
        )
    config = choice.cluster
    if cluster_resolver is not None:
        config = _config_from_resolver(cluster_resolver)
    if config is None:  # pragma: no cover - choose_strategy guarantees a cluster
        raise ValueError("parameter_server needs a cluster spec")
    key = ("parameter_server", json.dumps(config.as_tf_config(), sort_keys=True))
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    # Connecting to the cluster waits without a bound for servers that never start.
    wait_for_servers(config, timeout=cluster_timeout)
    resolver = cluster_resolver or _resolver_for(config, num_gpus)
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    with _CACHE_LOCK:
        _CACHE[key] = strategy
    return strategy


def run_server(*, cluster_resolver: Any = None, environ: Any = None) -> None:
    """Start this task's TensorFlow server and serve until the process is stopped.

    For the ``worker`` and ``ps`` tasks of a parameter-server cluster, which hold variables
    and run the steps the chief sends them but never train themselves. The server listens
    on this task's address from TF_CONFIG (or ``cluster_resolver``) without authentication or
    encryption: keep the cluster on a private network.

    Args:
        cluster_resolver: a ``ClusterResolver`` to use instead of TF_CONFIG / SLURM.
            Defaults to `None`.
        environ: variables to read instead of ``os.environ``. Defaults to `None`.

    Raises:
        ValueError: no cluster spec, or this task is a chief or evaluator (which train or
            evaluate rather than serve).

    Examples:
        >>> if tdu.cluster_task_type() in ("worker", "ps"):  # doctest: +SKIP
        ...     tdu.run_server()  # never returns
    """
    from tfdp_utils._tf import tf
    from tfdp_utils.cluster import cluster_from_environment

    config = (
        _config_from_resolver(cluster_resolver)
        if cluster_resolver is not None
        else cluster_from_environment(environ)
    )
    if config is None:
        raise ValueError(
            "run_server() found no cluster: TF_CONFIG is unset and this is no multi-task srun "
            "step. Set TF_CONFIG with this task's place in the cluster."
        )
    if config.task_type not in ("worker", "ps"):
        raise ValueError(
            f"run_server() is for 'worker' and 'ps' tasks, but this task is "
            f"{config.task_type}:{config.task_index}; call auto_strategy() and train instead."
        )
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    server = tf.distribute.Server(
        tf.train.ClusterSpec({k: list(v) for k, v in config.cluster.items()}),
        job_name=config.task_type,
        task_index=config.task_index,
        protocol="grpc",
        start=True,
    )
    logger.info("tfdp_utils: serving %s at %s", config.describe(), config.address)
    server.join()


def build_strategy(
    choice: StrategyChoice,
    *,
    cluster_resolver: Any = None,
    cross_device_ops: Any = None,
    cluster_timeout: float = DEFAULT_CLUSTER_TIMEOUT,
    collective_timeout: float | None = None,
    num_gpus: int = 0,
) -> Any:
    """Build the ``tf.distribute.Strategy`` for a :class:`StrategyChoice` (not for TPUs).

    ``collective_timeout`` here is the resolved bound (None: unbounded); see
    :func:`auto_strategy`.
    """
    from tfdp_utils import _tf
    from tfdp_utils._tf import tf

    if choice.kind == "parameter_server":
        return _build_parameter_server(
            choice,
            cluster_resolver=cluster_resolver,
            cluster_timeout=cluster_timeout,
            num_gpus=num_gpus,
        )
    if choice.kind == "multi_worker":
        return _build_multi_worker(
            choice,
            cluster_resolver=cluster_resolver,
            cluster_timeout=cluster_timeout,
            collective_timeout=collective_timeout,
            num_gpus=num_gpus,
        )
    if choice.kind == "mirrored":
        # Every MirroredStrategy in a process starts its collective group keys at the same
        # number; TensorFlow aborts when one key meets two device sets (a notebook that
        # builds a 2-device strategy, then a 4-device one), so each gets its own range.
        _tf.bump_collective_keys(tf.distribute.MirroredStrategy, _COLLECTIVE_KEY_STRIDE)
        return tf.distribute.MirroredStrategy(
            devices=list(choice.devices), cross_device_ops=cross_device_ops
        )
    if choice.kind == "one_device":
        return tf.distribute.OneDeviceStrategy(choice.devices[0])
    raise ValueError(f"build_strategy cannot build {choice.kind!r}; use auto_strategy().")


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
        cluster_timeout: seconds to wait for every peer of a cluster to start; the variable
            ``TFDP_CLUSTER_TIMEOUT`` replaces the default. Defaults to `300.0`.
        collective_timeout: seconds one TensorFlow call of a multi-worker job may wait (a
            collective whose peer is stuck or gone); past it, the job's collectives are
            aborted and ``fit`` raises ``tf.errors.DeadlineExceededError`` with a message
            naming this bound (see :mod:`tfdp_utils.faults`). A dead peer process is usually
            reported sooner by TensorFlow itself (``UnavailableError``). Keep it above your
            slowest step, first trace and save. The variable ``TFDP_COLLECTIVE_TIMEOUT``
            replaces the default; None or 0 turns the bound off. Defaults to `600.0`.

    Returns:
        A ``tf.distribute.Strategy``. Calling again returns an equivalent strategy (the same
        instance for multi-worker and TPU strategies, which TensorFlow allows once per process).

    Raises:
        ValueError: unknown ``prefer`` / ``TFDP_STRATEGY``, unknown devices, malformed TF_CONFIG,
            a bad ``collective_timeout``, a parameter-server cluster under Keras 3 or on a
            ``worker`` / ``ps`` task.
        ClusterTimeoutError: peers did not start within ``cluster_timeout``.
        TPUProbeError: ``prefer="tpu"`` and the TPU could not be reached.

    Examples:
        >>> strategy = auto_strategy()  # doctest: +SKIP
        >>> with strategy.scope():  # doctest: +SKIP
        ...     model = build_model()
    """
    if not probe_timeout > 0:
        raise ValueError(f"probe_timeout={probe_timeout!r} must be a positive number of seconds.")
    resolved_collective_timeout = resolve_collective_timeout(collective_timeout)
    cluster_timeout = _cluster_timeout(cluster_timeout)
    env = detect_environment(tpu=tpu)
    if cluster_resolver is not None:
        config = _config_from_resolver(cluster_resolver)
        env = dataclasses.replace(env, cluster=config)
        if prefer == "auto" and not env.forced_strategy and config is None:
            prefer = "multi_worker"
    choice = choose_strategy(env, prefer=prefer, devices=devices)
    strategy: Any = None
    if choice.kind == "tpu":
        try:
            strategy = _connect_tpu(env.tpu_address, probe_timeout)
        except Exception as exc:
            failure = (
                f"TPU evidence ({env.tpu_hint or 'local TPU devices'}) but probe failed: {exc}"
            )
            if _check_prefer(prefer, "prefer") == "tpu" or env.forced_strategy == "tpu":
                raise TPUProbeError(
                    f"{failure}. Check the TPU name/address, or pass probe_timeout=SECONDS to wait "
                    "longer, or prefer='auto' to fall back to other devices."
                ) from exc
            logger.warning("tfdp_utils: %s; falling back", failure)
            choice = choose_strategy(env, prefer=prefer, devices=devices, tpu_failure=failure)
    if strategy is None:
        strategy = build_strategy(
            choice,
            cluster_resolver=cluster_resolver,
            cross_device_ops=cross_device_ops,
            cluster_timeout=cluster_timeout,
            collective_timeout=resolved_collective_timeout,
            num_gpus=len(env.gpus),
        )
    _after_build(strategy)
    logger.info(
        "tfdp_utils: %s over %d replica(s) on %s: %s",
        choice.class_name,
        strategy.num_replicas_in_sync,
        ", ".join(choice.devices) or ("the cluster" if choice.cluster else "TPU"),
        choice.reason,
    )
    strategy._tfdp_choice = choice
    dataset_info.record_strategy(strategy)
    return strategy


def _after_build(strategy: Any) -> None:
    """Apply the Keras workarounds that this strategy needs (see :mod:`tfdp_utils.compat`)."""
    try:
        from tfdp_utils import compat
    except ImportError:  # pragma: no cover
        return
    apply = getattr(compat, "apply_for_strategy", None)
    if apply is not None:
        apply(strategy)


def explain(strategy: Any) -> StrategyChoice | None:
    """The :class:`StrategyChoice` behind a strategy from :func:`auto_strategy`, if any."""
    return getattr(strategy, "_tfdp_choice", None)


__all__ = [
    "StrategyChoice",
    "TPUProbeError",
    "auto_strategy",
    "build_strategy",
    "choose_strategy",
    "explain",
    "normalize_device",
    "run_server",
]
