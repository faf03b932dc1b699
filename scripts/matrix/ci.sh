#!/usr/bin/env bash
# CI's version step: the oldest supported release and the next one, side by side (two scratch
# environments built and checked at once; each check keeps about one core busy, and the builds
# mostly wait on the network).
#
#   oldest: TensorFlow 2.16 + Keras 3.10.0 and tf_keras 2.16, the whole smoke set (both Kerases);
#   next:   TensorFlow 2.22 (2.22.0rc0 today) with the keras-nightly it requires and
#           tf-keras-nightly: install, `tfdp-utils demo` and `tfdp-utils doctor` on both Kerases,
#           and the version-sensitive part of the smoke set (every compat probe and workaround,
#           the registry, the custom step and accumulation, auto_strategy on 2 replicas, the
#           logger's exact counts).
#
#   ci.sh [all]    build both environments, then check both (each pair at once)
#   ci.sh build    only build them (pip: mostly waiting on the network; .ci/run starts this in
#                  the background, niced, while its checks and tests run)
#   ci.sh check    only check them (built before by `ci.sh build` with the same ROOT)
#
# Each environment's lines are printed when it ends; the exit status is 1 when either failed.
set -uo pipefail
ACTION=${1:-all}
case $ACTION in
  all) OLDEST=smoke NEXT_ACTION=all ;;
  build) OLDEST=build NEXT_ACTION=build ;;
  check) OLDEST=check NEXT_ACTION=check ;;
  *) echo "usage: ci.sh [all|build|check]" >&2; exit 2 ;;
esac
REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=${ROOT:-/tmp/tfdp-matrix-ci}
NEXT=${TFDP_NEXT_MINOR:-22}
NEXT_SMOKE="tests/strategy/test_auto_strategy.py::test_one_cpu_and_two_logical_cpus_in_fresh_processes
tests/callbacks/test_callbacks_throughput.py::test_cumulative_counts_are_exact_globally_and_per_replica
tests/compat/test_compat.py tests/compat/test_compat_upstream.py tests/compat/test_registry.py
tests/training/test_training.py tests/training/test_accumulation.py"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
start=$SECONDS
# The oldest's check is the smoke set alone (SKIP=demo,doctor), the next's every check.
ROOT="$ROOT" SKIP=demo,doctor bash "$REPO/scripts/matrix/matrix.sh" "$OLDEST" 16 3.10.0 >"$logs/oldest" 2>&1 &
oldest=$!
ROOT="$ROOT" SKIP= SMOKE="$NEXT_SMOKE" bash "$REPO/scripts/matrix/matrix.sh" "$NEXT_ACTION" "$NEXT" >"$logs/next" 2>&1 &
next=$!
wait "$oldest"
oldest_rc=$?
wait "$next"
next_rc=$?
echo "-- TensorFlow 2.16 (oldest), exit $oldest_rc --"
cat "$logs/oldest"
echo "-- TensorFlow 2.$NEXT (next), exit $next_rc --"
cat "$logs/next"
echo "both environments ($ACTION) in $((SECONDS - start)) s"
[ "$oldest_rc" = 0 ] && [ "$next_rc" = 0 ]
