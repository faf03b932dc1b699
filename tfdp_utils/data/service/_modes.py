"""The tf.data service: reads and ``map_fn`` on other machines, with the builder's guarantees.

``build_distributed_dataset(..., service="grpc://host:port")`` moves the expensive part of the
pipeline (reading and ``map_fn``) to tf.data service workers (``tfdp-utils data-service
worker``) and keeps the rest on the trainer. Two modes:

* ``"synchronous"`` (the default): each trainer's share is the one the builder plans without
  the service (its own files under FILE, every W-th example of the arrays under DATA). The
  service splits that share dynamically between its workers (``distributed_epoch`` over a
  job this trainer alone reads), so each example of the share is read and mapped by exactly
  one service worker per epoch; the trainer then shuffles, batches, splits and pads as it
  always does. Every example once per epoch, equal steps on every worker and replica, and
  the same exact counts as without the service.
* ``"distributed_epoch"``: tf.data's own mode. The whole source is split dynamically between
  the service workers and batched there (whole steps); one trainer reads the epoch, each
  example once, with a partial step wherever a service worker's share ends, so the steps per
  epoch and per-step counts are not known in advance (counts are derived). Refused under
  several trainer workers: dynamic shares give them different step counts and
  MultiWorkerMirroredStrategy would hang at the epoch end.

Why not coordinated reads (``consumer_index``/``num_consumers``): they need an endless dataset
and hand each round to every consumer from one service worker, so with dynamic shares an
epoch cannot be exactly the examples of one pass; without them (every service worker reads
everything) each example comes once per service worker.

Nothing in TensorFlow bounds a wait on the service: a trainer whose dispatcher is missing, or
that has no service worker, or whose service worker died holding part of the epoch, waits
forever. The builder checks the service before returning (a dispatcher that accepts a
connection and a probe element served by a worker, both within ``service_timeout``), and
:class:`ServiceWatch` ends a trainer whose request to the service stays unanswered for
``service_timeout`` seconds, logging what it waits for every 30 s.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
from typing import Any, Literal

from tfdp_utils._tf import service_distribute, tf
from tfdp_utils._validate import env_seconds, positive_float, text
from tfdp_utils._waiting import Deadline, WaitProgress, join_within, wait_until
from tfdp_utils.data._pipeline import (
    Recipe,
    empty_batch,
    split_steps,
    with_options,
    worker_stages,
)
from tfdp_utils.data._sharding import ShardingPlan, parallel_reads
from tfdp_utils.data.service._watch import CHANGE, SERVICE_TIMEOUT_VARIABLE, ServiceWatch
from tfdp_utils.errors import ServiceTimeoutError

logger = logging.getLogger("tfdp_utils")

ServiceMode = Literal["synchronous", "distributed_epoch"]
SERVICE_MODES: tuple[str, ...] = ("synchronous", "distributed_epoch")
TASK_REFRESH_MS = 100
"""How often a trainer asks the dispatcher about its job's tasks, in milliseconds.

TensorFlow's default (1 s) ends every epoch up to a second late, as the trainer learns only
then that the job is done: on the benchmark's guide fixture an epoch of 0.25 s took 1.03 s.
At 100 ms the dispatcher answers ten small requests a second per trainer."""

DEFAULT_SERVICE_TIMEOUT = 300.0
"""Seconds a trainer waits for the service: to answer at start, and for data while training."""


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """Where the tf.data service is and how the builder uses it.

    Attributes:
        address: ``grpc://host:port`` of the dispatcher.
        host: the dispatcher's host.
        port: the dispatcher's port.
        mode: ``"synchronous"`` or ``"distributed_epoch"``.
        timeout: seconds to wait for the service (see :data:`DEFAULT_SERVICE_TIMEOUT`).
    """

    address: str
    host: str
    port: int
    mode: ServiceMode
    timeout: float


def check_service(
    service: Any, service_mode: Any, service_timeout: Any, environ: Any = None
) -> ServiceConfig | None:
    """The :class:`ServiceConfig` for the builder's arguments, None without a service.

    Raises:
        TypeError, ValueError: an address that is not ``[grpc://]host:port``, an unknown
            mode, a timeout that is not a positive number of seconds.
    """
    if service is None:
        return None
    fix = "Pass the dispatcher's address, e.g. service='grpc://10.0.0.5:5050'."
    address = text(service, "service", hint=fix).strip()
    protocol, sep, rest = address.partition("://")
    if not sep:
        protocol, rest = "grpc", address
    host, colon, port_text = rest.rpartition(":")
    if protocol != "grpc" or not colon or not host or not port_text.isdigit():
        raise ValueError(
            f"service={service!r} is not a tf.data service dispatcher address; expected "
            f"'grpc://host:port' (the only protocol tfdp-utils' servers speak). {fix}"
        )
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"service={service!r} has port {port}, outside 1..65535. {fix}")
    if service_mode not in SERVICE_MODES:
        raise ValueError(
            f"service_mode={service_mode!r} is not a tf.data service mode; expected one of "
            f"{', '.join(repr(m) for m in SERVICE_MODES)}. 'synchronous' keeps every example "
            "once per epoch and equal steps on every worker."
        )
    if service_timeout is None:
        source = os.environ if environ is None else environ
        raw = source.get(SERVICE_TIMEOUT_VARIABLE, "").strip()
        timeout = (
            env_seconds(SERVICE_TIMEOUT_VARIABLE, raw, example=DEFAULT_SERVICE_TIMEOUT)
            if raw
            else DEFAULT_SERVICE_TIMEOUT
        )
        timeout = positive_float(timeout, SERVICE_TIMEOUT_VARIABLE, unit="number of seconds")
    else:
        timeout = positive_float(
            service_timeout,
            "service_timeout",
            unit="number of seconds",
            hint=f"Pass e.g. service_timeout={DEFAULT_SERVICE_TIMEOUT:g}.",
        )
    mode: ServiceMode = "synchronous" if service_mode == "synchronous" else "distributed_epoch"
    return ServiceConfig(f"grpc://{host}:{port}", host, port, mode, timeout)


# ------------------------------------------------------------------------------- the plan


def service_plan(
    plan: ShardingPlan, config: ServiceConfig, *, cache: bool | str = False
) -> ShardingPlan:
    """``plan`` as the service reads it, with the guarantee in its reason.

    Raises:
        ValueError: a combination the service cannot give the builder's guarantees for.
    """
    where = f"tf.data service {config.address} ({config.mode})"
    if cache:
        raise ValueError(
            f"cache={cache!r} with service={config.address!r}: the cache would hold the "
            "service's output on the trainer, so later epochs would not use the service. "
            "Pass cache=False with service=, or no service to cache locally."
        )
    if config.mode == "distributed_epoch":
        if plan.num_workers > 1:
            raise ValueError(
                f"service_mode='distributed_epoch' with {plan.num_workers} trainer workers: "
                "the service hands each trainer a dynamic share, so the trainers would run "
                "different numbers of steps and MultiWorkerMirroredStrategy would hang at the "
                "end of the epoch. Use service_mode='synchronous' (each trainer's share split "
                "between the service workers, equal steps), or one trainer worker."
            )
        size = "" if plan.num_examples is None else f" ({plan.num_examples} examples)"
        reason = (
            f"{where}: the whole source{size} split dynamically between the service workers "
            "and batched there; each example once per epoch, but each service worker's share "
            "ends in a partial step, so steps per epoch and per-step counts are not known "
            "(counts derived, every step taken as full)"
        )
        return dataclasses.replace(
            plan, reason=reason, examples_per_worker=None, steps_per_worker=None
        )
    if plan.num_workers > 1 and plan.policy == "data" and plan.source_kind != "arrays":
        what = "files (fewer files than workers)" if plan.source_kind == "files" else "a dataset"
        raise ValueError(
            f"service={config.address!r} on {plan.num_workers} trainer workers needs a share "
            f"per trainer that the service can split, but the source is {what}, which every "
            "trainer would read whole and thin out (DATA). Pass at least as many files as "
            "trainer workers, numpy arrays, or a fn(input_context) source that returns each "
            "trainer's own splittable dataset (e.g. from Dataset.list_files)."
        )
    if plan.policy == "hint" or (plan.policy == "file" and plan.source_kind == "dataset"):
        raise ValueError(
            f"shard_policy={plan.policy!r} on a tf.data.Dataset with service=: tf.data's own "
            "autoshard cannot run inside the service. Pass file paths as source (the builder "
            "then gives each trainer its own files), or shard_policy='auto'."
        )
    reason = (
        f"{plan.reason}; read and mapped by the {where}: each trainer's share is split "
        "dynamically between the service workers (each example read by exactly one of them "
        "per epoch) and batched on the trainer, so every example is seen once per epoch with "
        "equal steps on every worker; nothing is dropped or repeated unless a service worker "
        "fails, which ends the trainer within service_timeout"
    )
    return dataclasses.replace(plan, reason=reason)


# ------------------------------------------------------------------------ bounded waits


def wait_for_service(config: ServiceConfig, *, interval: float | None = None) -> None:
    """Return once the dispatcher answers and a service worker serves a probe element.

    Raises:
        ServiceTimeoutError: nothing within ``config.timeout`` seconds; the message says
            which of the two, the bound and how to change it.
    """
    deadline = Deadline(config.timeout)
    wait_until(
        lambda: _accepts(config, deadline),
        deadline=deadline,
        progress=WaitProgress(
            f"the tf.data service dispatcher at {config.address}",
            bound=config.timeout,
            change=CHANGE,
            interval=interval,
        ),
        timeout_error=lambda: ServiceTimeoutError(
            f"no tf.data service dispatcher answered at {config.address} within "
            f"service_timeout={config.timeout:g} s (change it with {CHANGE}). Start one "
            f"with `tfdp-utils data-service dispatcher --port {config.port}` on "
            f"{config.host}, or pass the address it prints."
        ),
        poll_interval=0.5,
    )
    outcome: dict[str, Any] = {}

    def probe() -> None:
        try:
            remote = tf.data.Dataset.range(1).apply(
                tf.data.experimental.service.distribute("distributed_epoch", config.address)
            )
            outcome["values"] = [int(v) for v in remote]
        except Exception as exc:  # handed to the caller below
            outcome["error"] = exc

    # TensorFlow's client has no deadline: the probe runs in a thread that is left behind
    # (a daemon) when the bound passes.
    thread = threading.Thread(target=probe, name="tfdp-service-probe", daemon=True)
    thread.start()
    progress = WaitProgress(
        f"a tf.data service worker registered with {config.address} to serve data",
        bound=config.timeout,
        change=CHANGE,
        interval=interval,
    )
    join_within(thread, deadline=deadline, progress=progress)
    if "error" in outcome:
        raise RuntimeError(
            f"the tf.data service at {config.address} failed a probe read: {outcome['error']}"
        ) from outcome["error"]
    if thread.is_alive():
        raise ServiceTimeoutError(
            f"the tf.data service dispatcher at {config.address} answers, but no service "
            f"worker served a probe element within service_timeout={config.timeout:g} s "
            f"(change it with {CHANGE}). Start workers with `tfdp-utils data-service worker "
            f"--dispatcher {config.host}:{config.port}`."
        )


def _accepts(config: ServiceConfig, deadline: Deadline) -> bool:
    try:
        with socket.create_connection(
            (config.host, config.port), timeout=deadline.slice(2.0, 0.05)
        ):
            return True
    except OSError:
        return False


def _from_service(remote: Any, config: ServiceConfig, watch: ServiceWatch) -> Any:
    """``remote`` read through the service, each request and arrival told to ``watch``.

    A zip asks its inputs in order, so a request's mark runs just before the read that may
    block; its index goes with the chunk to the arrival's mark. An empty chunk after the
    read's end marks the end.
    """
    read = remote.apply(
        service_distribute(config.address, task_refresh_interval_ms=TASK_REFRESH_MS)
    )
    end = tf.data.Dataset.from_tensors(empty_batch(read.element_spec))

    def ask(index: Any) -> Any:
        watch.asked(int(index))
        return index

    def note(index: Any, size: Any) -> Any:
        watch.arrived(int(index), int(size))
        return size

    def arrival(index: Any, element: Any) -> Any:
        size = tf.shape(tf.nest.flatten(element)[0], out_type=tf.int64)[0]
        done = tf.py_function(note, [index, size], tf.int64)
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(tf.identity, element)

    asks = tf.data.Dataset.counter().map(lambda i: tf.py_function(ask, [i], tf.int64))
    arrivals = tf.data.Dataset.zip((asks, read.concatenate(end))).map(arrival)
    return arrivals.filter(lambda *e: tf.shape(tf.nest.flatten(e)[0], out_type=tf.int64)[0] > 0)


# ------------------------------------------------------------------------- the pipelines


def _share(recipe: Recipe, source: Any, arrays: Any, context: Any) -> Any:
    """This trainer's unbatched examples as a dataset the service can split dynamically."""
    plan, index = recipe.plan, int(context.input_pipeline_id)
    workers = int(context.num_input_pipelines)
    if plan.source_kind == "files":
        files = list(plan.files_per_worker[index])
        reads = parallel_reads(len(files))
        names = tf.data.Dataset.from_tensor_slices(tf.constant(files or [""])).take(len(files))
        return names.interleave(recipe.reader, cycle_length=reads, num_parallel_calls=reads)
    if plan.source_kind == "function":
        return source(context)
    if plan.source_kind == "arrays" and workers > 1:
        own = tf.nest.map_structure(lambda a: a[index::workers], arrays)
        return tf.data.Dataset.from_tensor_slices(own)
    return source


def _local_recipe(recipe: Recipe) -> Recipe:
    """The trainer's part: no map (done by the service), no shard (the share is its own)."""
    plan = dataclasses.replace(recipe.plan, policy="off", source_kind="arrays")
    return dataclasses.replace(recipe, plan=plan, map_fn=None, cache=False)


def synchronous_dataset(
    recipe: Recipe, source: Any, arrays: Any, context: Any, config: ServiceConfig
) -> Any:
    """One trainer's pipeline: its share read and mapped by the service, batched here."""
    workers, index = int(context.num_input_pipelines), int(context.input_pipeline_id)
    watch = ServiceWatch(config.address, config.timeout)
    remote = _share(recipe, source, arrays, context)
    if recipe.map_fn is not None:
        remote = remote.map(recipe.map_fn, num_parallel_calls=tf.data.AUTOTUNE)
    # Whole steps of this trainer cross the network as one element each, then come apart.
    step = recipe.shape.per_replica_batch_size * recipe.replicas_per_worker
    dataset = _from_service(remote.batch(step), config, watch).unbatch()
    local = _local_recipe(recipe)
    dataset = worker_stages(local, dataset, workers, index, deterministic=False)
    return dataset


def distributed_epoch_dataset(
    recipe: Recipe, source: Any, arrays: Any, context: Any, config: ServiceConfig
) -> Any:
    """The single trainer's pipeline: the whole source split and batched by the service."""
    watch = ServiceWatch(config.address, config.timeout)
    remote = _share(recipe, source, arrays, context)
    if recipe.map_fn is not None:
        remote = remote.map(recipe.map_fn, num_parallel_calls=tf.data.AUTOTUNE)
    local = recipe.replicas_per_worker
    step = recipe.shape.per_replica_batch_size * local
    dataset = _from_service(remote.batch(step, drop_remainder=recipe.drop_remainder), config, watch)
    if recipe.repeat:
        dataset = dataset.repeat()
    if local > 1:
        dataset = split_steps(dataset, local)
    off = tf.data.experimental.AutoShardPolicy.OFF
    local_recipe = _local_recipe(recipe)
    return with_options(local_recipe, dataset, off, deterministic=False)


def distribute(
    strategy: Any, recipe: Recipe, source: Any, arrays: Any, input_options: Any, config: Any
) -> Any:
    """The distributed dataset read through the service (after :func:`wait_for_service`)."""
    wait_for_service(config)
    build = synchronous_dataset if config.mode == "synchronous" else distributed_epoch_dataset
    return strategy.distribute_datasets_from_function(
        lambda context: build(recipe, source, arrays, context, config), options=input_options
    )
