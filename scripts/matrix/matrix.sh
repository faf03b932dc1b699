#!/usr/bin/env bash
# The version matrix: one scratch environment per (TensorFlow minor, Keras 3) pair, tensorflow-cpu
# (the minor's newest release, or its release candidate: 22 is 2.22.0rc0 with keras-nightly)
# plus tf-keras of the same minor (installed --no-deps, as the README does), the repo installed
# non-editable; in each: `tfdp-utils demo`, `tfdp-utils doctor` and the smoke set, on Keras 3 and
# on tf_keras (TF_USE_LEGACY_KERAS=1). Results go to $ROOT/results/<env>.tsv; `summarize.py`
# turns them into docs/versions.md.
#
#   scripts/matrix/matrix.sh all 16 3.10.0     # build + checks: TF 2.16, Keras 3.10.0
#   scripts/matrix/matrix.sh all 21            # TF 2.21 with the Keras pip picks today
#   scripts/matrix/matrix.sh all 22            # TF 2.22.0rc0, keras-nightly, tf-keras-nightly
#   KERAS_SPEC=/tmp/keras-main scripts/matrix/matrix.sh all 21 main   # a Keras source tree
#   scripts/matrix/matrix.sh smoke 16 3.10.0   # only the smoke set (what .ci/run does)
#   SKIP=demo,doctor scripts/matrix/matrix.sh check 21
# Environments are run one at a time (each test run takes a core or two).
set -uo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
ROOT=${ROOT:-/tmp/tfdp-matrix}
PIP_CACHE=${PIP_CACHE:-$ROOT/pip-cache}
ACTION=${1:?usage: matrix.sh build|check|smoke|all MINOR [KERAS]}
M=${2:?TensorFlow minor, e.g. 16}
K=${3:-}
NAME="tf2.$M-keras${K:-latest}"
VENV="$ROOT/venv/$NAME"
PY="$VENV/bin/python"
LOG="$ROOT/logs/$NAME"
RESULTS="$ROOT/results/$NAME.tsv"
TO="timeout -k 5 ${CHECK_TIMEOUT:-900}"
# The smoke set: no cluster needed. auto_strategy on 2 replicas, the builder's exactly-once,
# the logger's counts, each compat probe and workaround, the custom step, accumulation.
SMOKE=${SMOKE:-"tests/strategy/test_auto_strategy.py::test_one_cpu_and_two_logical_cpus_in_fresh_processes
tests/strategy/test_auto_strategy.py::test_four_logical_cpus_give_mirrored
tests/data/test_epochs.py tests/data/test_data.py
tests/callbacks/test_callbacks_throughput.py::test_cumulative_counts_are_exact_globally_and_per_replica
tests/callbacks/test_callbacks_throughput.py::test_builder_dataset_needs_no_batch_size_and_counts_partial_steps
tests/compat/test_compat.py tests/compat/test_compat_upstream.py tests/compat/test_registry.py
tests/training/test_training.py tests/training/test_accumulation.py"}
mkdir -p "$LOG" "$ROOT/results" "$PIP_CACHE"

record() { # check outcome detail
  printf '%s\t%s\t%s\t%s\n' "$NAME" "$1" "$2" "$3" >>"$RESULTS"
  printf '%-26s %-14s %-5s %s\n' "$NAME" "$1" "$2" "$3"
}

build() {
  rm -rf "$VENV" "$RESULTS"
  python3 -m venv "$VENV" || return 1
  local keras=()
  if [ -n "${KERAS_SPEC:-}" ]; then keras=("$KERAS_SPEC"); elif [ -n "$K" ]; then keras=("keras==$K"); fi
  local pip=("$PY" -m pip install -q --cache-dir "$PIP_CACHE")
  # The newest 2.M release, its release candidate while it has no final one (2.22.0rc0); its
  # Keras comes with it (`keras`, or `keras-nightly` for 2.22). tf-keras of the minor, else the
  # newest tf-keras-nightly build of it (tf-keras has no 2.22 release yet).
  local next=$((M + 1))
  { "${pip[@]}" "tensorflow-cpu>=2.$M.0rc0,<2.$next.0" pytest pytest-timeout hypothesis &&
    { [ ${#keras[@]} -eq 0 ] || "${pip[@]}" "${keras[@]}"; } &&
    "${pip[@]}" "$REPO" &&  # its own dependencies (tensorboard...); it requires no Keras
    { "${pip[@]}" --no-deps "tf-keras>=2.$M.0rc0,<2.$next.0" ||
      "${pip[@]}" --no-deps "tf-keras-nightly>=2.$M.0.dev0,<2.$next.0.dev0"; }; } >"$LOG/pip.txt" 2>&1 ||
    { record install FAIL "see $LOG/pip.txt"; return 1; }
  record install ok "$("$PY" -c 'import importlib.metadata as m
names = ("tensorflow-cpu", "keras", "keras-nightly", "tf-keras", "tf-keras-nightly")
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
print(" ".join(f"{d}={version(d)}" for d in names if version(d)))')"
}

timed() { # logname cmd...: sets RC and SECONDS_TAKEN
  local name=$1; shift; local t0=$SECONDS
  $TO "$@" >"$LOG/$name.txt" 2>&1; RC=$?; SECONDS_TAKEN=$((SECONDS - t0))
}

smoke() { # label [TF_USE_LEGACY_KERAS value]
  local label=$1 legacy=${2:-} scratch="$ROOT/scratch/$NAME"
  rm -rf "$scratch"; mkdir -p "$scratch"; cp -r "$REPO/tests" "$REPO/pyproject.toml" "$scratch/"
  local marks=(); [ -n "$legacy" ] && marks=(-m keras)
  # shellcheck disable=SC2086
  (cd "$scratch" && TF_USE_LEGACY_KERAS=$legacy timed "$label" "$PY" -m pytest -q -rfE -p no:cacheprovider \
      "${marks[@]}" $SMOKE; echo "$RC $SECONDS_TAKEN" >"$LOG/$label.rc")
  read -r RC SECONDS_TAKEN <"$LOG/$label.rc"
  local summary; summary=$(grep -E '[0-9]+ (passed|failed|error)' "$LOG/$label.txt" | tail -1 | tr -d '=')
  record "$label" "$([ "$RC" = 0 ] && echo ok || echo FAIL)" "${SECONDS_TAKEN}s ${summary:-rc=$RC, no summary}"
  cause "$label"
}

cause() { # label: a failed check shows its cause where CI prints this environment's lines
  # pytest's short summary (the failing tests and their messages, with the workers' output for
  # real-process tests), or the log's tail when there is none (a timeout, a crash, demo, doctor).
  [ "$RC" = 0 ] && return
  { sed -n '/short test summary info/,$p' "$LOG/$1.txt" | grep -v 'oneDNN custom operations' |
      grep . || tail -n 40 "$LOG/$1.txt"; } | head -n 80 | sed 's/^/    | /'
}

check() {
  case ",${SKIP:-}," in *,demo,*) ;; *)
    for legacy in "" 1; do
      local label=demo${legacy:+-tf_keras}
      TF_USE_LEGACY_KERAS=$legacy timed "$label" "$VENV/bin/tfdp-utils" demo
      record "$label" "$([ $RC = 0 ] && echo ok || echo FAIL)" \
        "${SECONDS_TAKEN}s $(grep -iE 'accuracy' "$LOG/$label.txt" | tail -1 | cut -c1-60)"
      cause "$label"
    done ;;
  esac
  case ",${SKIP:-}," in *,doctor,*) ;; *)
    for legacy in "" 1; do
      local label=doctor${legacy:+-tf_keras}
      TF_USE_LEGACY_KERAS=$legacy timed "$label" "$VENV/bin/tfdp-utils" doctor
      record "$label" "$([ $RC = 0 ] && echo ok || echo FAIL)" \
        "${SECONDS_TAKEN}s $(grep -cE '^ *PASS' "$LOG/$label.txt") PASS, $(grep -cE '^ *FAIL' "$LOG/$label.txt") FAIL"
      cause "$label"
    done ;;
  esac
  case ",${SKIP:-}," in *,smoke,*) ;; *) smoke smoke ;; esac
  case ",${SKIP:-}," in *,smoke_legacy,*) ;; *) smoke smoke-tf_keras 1 ;; esac
}

case $ACTION in
  build) build ;;
  check) check ;;
  smoke) build && SKIP=demo,doctor check ;;
  all) build && check ;;
  *) echo "unknown action $ACTION" >&2; exit 2 ;;
esac
# Exit status 1 when any check of this environment failed.
[ -f "$RESULTS" ] && ! grep -q "	FAIL	" "$RESULTS"
