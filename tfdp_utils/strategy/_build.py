"""Building ``tf.distribute`` strategies from a :class:`StrategyChoice`, every wait bounded.

The TensorFlow side of :func:`tfdp_utils.auto_strategy`: connecting to a TPU with each
networked step under ``probe_timeout``, waiting for a cluster's peers before
MultiWorkerMirroredStrategy's constructor (which would wait forever), the collective
watchdog, parameter-server clusters and the servers of their non-chief tasks.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tfdp_utils import _variables
from tfdp_utils._public import public
from tfdp_utils._validate import env_seconds, positive_float
from tfdp_utils._waiting import Deadline, WaitProgress, join_within
from tfdp_utils.cluster._config import ClusterConfig
from tfdp_utils.cluster._grpc_probe import describe as describe_answer
from tfdp_utils.cluster._grpc_probe import grpc_answer
from tfdp_utils.cluster._rendezvous import wait_for_peers, wait_for_servers
from tfdp_utils.cluster._topology import is_multi_worker
from tfdp_utils.strategy._collective_bound import COLLECTIVE_TIMEOUT_VARIABLE
from tfdp_utils.strategy._faults import CollectiveWatchdog

if TYPE_CHECKING:
    from tfdp_utils.strategy._strategy_choice import StrategyChoice

logger = logging.getLogger("tfdp_utils")

DEFAULT_CLUSTER_TIMEOUT = 300.0
CLUSTER_TIMEOUT_VARIABLE = _variables.CLUSTER_TIMEOUT
# Group keys set aside for each MirroredStrategy built here (a strategy uses a handful).
_COLLECTIVE_KEY_STRIDE = 10_000

_CACHE: dict[tuple[Any, ...], Any] = {}
_CACHE_LOCK = threading.Lock()


def resolve_cluster_timeout(value: float, environ: Mapping[str, str] | None = None) -> float:
    """The peer-wait bound in force: the argument, or ``TFDP_CLUSTER_TIMEOUT`` for the default.

    Args:
        value: seconds, or :data:`DEFAULT_CLUSTER_TIMEOUT` (which the variable replaces).
        environ: variables to read instead of ``os.environ``. Defaults to `None`.

    Raises:
        TypeError, ValueError: a bound that is not a positive number of seconds, naming where
            it came from.
    """
    source = os.environ if environ is None else environ
    override = source.get(CLUSTER_TIMEOUT_VARIABLE, "").strip()
    name = "cluster_timeout"
    hint = ""
    if override and value == DEFAULT_CLUSTER_TIMEOUT:
        name = CLUSTER_TIMEOUT_VARIABLE
        hint = f"Set it to e.g. {DEFAULT_CLUSTER_TIMEOUT:g}, or unset it for that default."
        value = env_seconds(name, override, example=DEFAULT_CLUSTER_TIMEOUT)
    return positive_float(value, name, unit="number of seconds", hint=hint)


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
    progress = WaitProgress(what, bound=timeout, change="auto_strategy(probe_timeout=SECONDS)")
    if not join_within(thread, deadline=Deadline(timeout), progress=progress):
        raise TimeoutError(f"{what} did not answer within probe_timeout={timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def tpu_initialized(resolver: Any) -> bool:
    """Whether this process already initialised the TPU system ``resolver`` names (by
    ``tf.tpu.experimental.initialize_tpu_system``, ours or the program's own)."""
    from tfdp_utils._tf import initialized_tpu_systems

    return str(getattr(resolver, "_tpu", "") or "") in initialized_tpu_systems()


def connect_tpu(address: str | None, probe_timeout: float) -> Any:
    """Resolve, reach and initialise a TPU, each networked step bounded by ``probe_timeout``."""
    from tfdp_utils._tf import tf

    key = ("tpu", address)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    resolver = _call_with_timeout(
        lambda: tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address or None),
        probe_timeout,
        "TPU resolver (GCE metadata server)",
    )
    if not tpu_initialized(resolver):
        # Initialising again would wipe what the program already placed on the TPU; as
        # TensorFlow's own auto_strategy, reuse a system this process initialised itself.
        master = str(resolver.master() or "")
        if master.startswith("grpc://"):
            target = master[len("grpc://") :]
            # A worker that accepts and never answers would hold TensorFlow's connect forever.
            answer = grpc_answer(target, probe_timeout)
            if answer != "grpc":
                raise TimeoutError(describe_answer(answer, target, probe_timeout))
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


def config_from_resolver(resolver: Any) -> ClusterConfig | None:
    from tfdp_utils.cluster._config import validate_cluster

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
    called_at: float | None = None,
) -> Any:
    from tfdp_utils._tf import tf

    config = choice.cluster
    if cluster_resolver is not None:
        config = config_from_resolver(cluster_resolver)
    resolver = cluster_resolver
    if resolver is None and config is not None:
        resolver = _resolver_for(config, num_gpus)
    spec = json.dumps(config.as_tf_config(), sort_keys=True) if config else None
    key = ("multi_worker", spec, choice.devices, collective_timeout)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    if config is not None and config.num_workers > 1:
        from tfdp_utils import _exit_barrier

        _exit_barrier.bound()  # a malformed TFDP_EXIT_BARRIER fails here, before any wait
        # MWMS's constructor waits forever for a missing worker and cannot be interrupted
        # (the call holds the GIL, SIGTERM is ignored), so bound the wait before calling it.
        wait_for_peers(config, timeout=cluster_timeout, called_at=called_at)
    options = _communication_options(choice.devices)
    if resolver is None:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
    from tfdp_utils.compat import _changes

    _changes.restore_sigterm(applied_by="auto_strategy()")  # SIGTERM ends the job again
    _hold_exits(strategy, config)  # the workers leave together
    if is_multi_worker(strategy):
        from tfdp_utils.strategy._ctrl_c import CtrlCAbort

        # Ctrl-C ends a worker held in an all-reduce by a peer Ctrl-C already stopped.
        _changes.abort_on_ctrl_c(CtrlCAbort().on_interrupt, applied_by="auto_strategy()")
    if collective_timeout is not None and is_multi_worker(strategy):
        CollectiveWatchdog(collective_timeout, phases=_phase_tracker(strategy)).start()
        logger.info(
            "tfdp_utils: multi-worker calls are bounded by collective_timeout=%g s (change it "
            "with auto_strategy(collective_timeout=SECONDS) or %s)",
            collective_timeout,
            COLLECTIVE_TIMEOUT_VARIABLE,
        )
    with _CACHE_LOCK:
        _CACHE[key] = strategy
    return strategy


def _hold_exits(strategy: Any, config: ClusterConfig | None) -> None:
    """Install the exit barrier when ``strategy`` spans 2 or more training workers."""
    if config is None or config.worker_rank is None or not is_multi_worker(strategy):
        return
    from tfdp_utils.cluster._coordination import CoordinationStore
    from tfdp_utils.compat import _changes
    from tfdp_utils.strategy._faults import stop_watchdogs

    addresses = [address for _, _, address in config.training_tasks]
    if len(addresses) < 2:
        return
    _changes.hold_exits(
        CoordinationStore(),
        rank=config.worker_rank,
        addresses=addresses,
        before=stop_watchdogs,
        applied_by="auto_strategy()",
    )


def _phase_tracker(strategy: Any) -> Any:
    """How the watchdog publishes this worker's phase: through the coordination service."""
    from tfdp_utils.cluster._coordination import CoordinationStore
    from tfdp_utils.cluster._topology import position_of
    from tfdp_utils.strategy._phase_board import PhaseBoard
    from tfdp_utils.strategy._phase_tracker import PhaseTracker

    position = position_of(strategy)
    board = PhaseBoard(CoordinationStore(), worker=position.index, num_workers=position.num_workers)
    return lambda in_call: PhaseTracker(board, in_call=in_call, facts=step_facts)


def step_facts(frame: Any) -> Any:
    """What the watchdog reads of the ``fit`` on ``frame``'s stack: the batches trained (steps
    as users count them) and the input clock."""
    from tfdp_utils import _tf
    from tfdp_utils.strategy._phase_tracker import fit_facts

    return fit_facts(frame, count=_tf.batches_trained)


def parameter_server_refusal(kind: str, *, keras3: bool, keras_version: str) -> str | None:
    """Why a ``parameter_server`` choice cannot be built with this Keras, or None. Pure.

    Keras 3's TensorFlow trainer has no ParameterServerStrategy path (tf_keras drives it
    through a ClusterCoordinator inside ``Model.fit``); ``tfdp-utils env`` asks this too.
    """
    if kind != "parameter_server" or not keras3:
        return None
    return (
        f"this is the chief of a parameter-server cluster, but the active Keras is Keras "
        f"{keras_version}, whose Model.fit cannot train with ParameterServerStrategy. "
        "Set TF_USE_LEGACY_KERAS=1 (with tf-keras installed: pip install "
        "'tfdp-utils[legacy]') before TensorFlow is imported to train with tf_keras, or "
        "remove 'ps' from the cluster to train with MultiWorkerMirroredStrategy."
    )


def _build_parameter_server(
    choice: StrategyChoice,
    *,
    cluster_resolver: Any,
    cluster_timeout: float,
    num_gpus: int,
    called_at: float | None = None,
) -> Any:
    from tfdp_utils._tf import IS_KERAS3, KERAS_VERSION, tf

    refused = parameter_server_refusal(choice.kind, keras3=IS_KERAS3, keras_version=KERAS_VERSION)
    if refused is not None:
        raise ValueError(refused)  # before any network wait
    config = choice.cluster
    if cluster_resolver is not None:
        config = config_from_resolver(cluster_resolver)
    if config is None:  # pragma: no cover - choose_strategy guarantees a cluster
        raise ValueError("parameter_server needs a cluster spec")
    key = ("parameter_server", json.dumps(config.as_tf_config(), sort_keys=True))
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    # Connecting to the cluster waits without a bound for servers that never start.
    wait_for_servers(config, timeout=cluster_timeout, called_at=called_at)
    resolver = cluster_resolver or _resolver_for(config, num_gpus)
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    with _CACHE_LOCK:
        _CACHE[key] = strategy
    return strategy


@public("tfdp_utils")
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
    from tfdp_utils.cluster._environments import cluster_from_environment

    config = (
        config_from_resolver(cluster_resolver)
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
    called_at: float | None = None,
) -> Any:
    """Build the ``tf.distribute.Strategy`` for a :class:`StrategyChoice` (not for TPUs).

    ``collective_timeout`` here is the resolved bound (None: unbounded); see
    :func:`auto_strategy`. ``called_at`` is when ``auto_strategy()`` was called
    (``time.monotonic()``), so a peer wait's timeout error can say how long the call took.
    """
    from tfdp_utils._tf import tf

    if choice.kind == "parameter_server":
        return _build_parameter_server(
            choice,
            cluster_resolver=cluster_resolver,
            cluster_timeout=cluster_timeout,
            num_gpus=num_gpus,
            called_at=called_at,
        )
    if choice.kind == "multi_worker":
        return _build_multi_worker(
            choice,
            cluster_resolver=cluster_resolver,
            cluster_timeout=cluster_timeout,
            collective_timeout=collective_timeout,
            num_gpus=num_gpus,
            called_at=called_at,
        )
    if choice.kind == "mirrored":
        # Every MirroredStrategy in a process starts its collective group keys at the same
        # number; TensorFlow aborts when one key meets two device sets (a notebook that
        # builds a 2-device strategy, then a 4-device one), so each gets its own range.
        from tfdp_utils.compat import _changes as compat_changes

        compat_changes.bump_collective_keys(
            tf.distribute.MirroredStrategy, _COLLECTIVE_KEY_STRIDE, applied_by="auto_strategy()"
        )
        return tf.distribute.MirroredStrategy(
            devices=list(choice.devices), cross_device_ops=cross_device_ops
        )
    if choice.kind == "one_device":
        return tf.distribute.OneDeviceStrategy(choice.devices[0])
    raise ValueError(f"build_strategy cannot build {choice.kind!r}; use auto_strategy().")
