#!/usr/bin/env bash
# Rebuild one tfdp-utils test environment and run the checks, one result line per check.
# usage: matrix.sh build|check|all MINOR [KERAS]     e.g.  matrix.sh all 16 3.0.5
#   MINOR = 16..21 (tensorflow-cpu 2.MINOR.*); KERAS = Keras 3 pin ("" = whatever pip resolves today)
# env: REPO (default /tmp/matrix/repo: the code under test, installed non-editable),
#      SMOKE_FILES (override the smoke set), SKIP=demo,doctor,smoke,smoke_legacy (comma list),
#      TAG (suffix for log/scratch dirs, e.g. a patch name)
# Logs: /tmp/matrix/logs/<env>[TAG]/ ; each check line is also appended to results.txt there.
set -u
M=${2:?minor}; K=${3:-}
ROOT=${ROOT:-/tmp/matrix}; REPO=${REPO:-$ROOT/repo}
NAME=tf$M${K:+-k$K}; VENV=$ROOT/venvs/$NAME; PY=$VENV/bin/python
LOG=$ROOT/logs/$NAME${TAG:-}; mkdir -p "$LOG"
SCRATCH=$ROOT/scratch/$NAME${TAG:-}
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONDONTWRITEBYTECODE=1
TO="timeout -k 5 600"
SMOKE_FILES=${SMOKE_FILES:-"tests/pure tests/test_auto_strategy.py tests/test_data.py tests/test_callbacks_throughput.py tests/test_compat.py tests/test_training.py tests/test_accumulation.py tests/test_mixed_precision.py"}
say() { printf '%-14s %-22s %s\n' "$NAME${TAG:-}" "$1" "$2" | tee -a "$LOG/results.txt"; }

build() {
  rm -rf "$VENV"; python3 -m venv "$VENV" || return 1
  "$PY" -m pip -q install -U pip >/dev/null 2>&1
  "$PY" -m pip install "tensorflow-cpu==2.$M.*" ${K:+"keras==$K"} "$REPO" \
      pytest pytest-timeout hypothesis scikit-learn matplotlib >"$LOG/pip.txt" 2>&1 || { say build "FAIL pip (see $LOG/pip.txt)"; return 1; }
  "$PY" -m pip install --no-deps "tf-keras==2.$M.*" >>"$LOG/pip.txt" 2>&1 || { say build "FAIL tf-keras"; return 1; }
  say build "$("$PY" -m pip list 2>/dev/null | awk '{n=tolower($1); gsub("_","-",n)} n~/^(tensorflow-cpu|keras|tf-keras|numpy|ml-dtypes|tfdp-utils)$/{printf "%s=%s ",n,$2}')"
}

reinstall() { # put REPO (e.g. a patched copy) into the venv, nothing else
  "$PY" -m pip install --no-deps --force-reinstall "$REPO" >"$LOG/reinstall.txt" 2>&1 && say reinstall "$REPO"
}

timed() { # logname cmd... -> RC, T
  local n=$1; shift; local t0; t0=$(date +%s.%N)
  nice -n 15 $TO "$@" >"$LOG/$n.txt" 2>&1; RC=$?
  T=$(printf '%.0f' "$(echo "$(date +%s.%N) - $t0" | bc)")
}

pyt() { # label logname extra-args...  (one pytest process per file, each under its own timeout)
  local label=$1 ln=$2; shift 2; local f b
  for f in $SMOKE_FILES; do
    b=$(basename "$f" .py)
    [ "$label" = smoke-legacy ] && [ "$b" = pure ] && continue   # no keras-marked tests there
    timed "${ln}_$b" "$PY" -m pytest -q -rfE --timeout 600 -p no:cacheprovider "$@" "$f"
    local sum; sum=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected).* in [0-9.]+s' "$LOG/${ln}_$b.txt" | tail -1 | sed 's/=//g')
    [ -z "$sum" ] && sum="(no summary: rc=$RC, timeout?)"
    say "$label:$b" "rc=$RC ${T}s $sum"
    grep -E '^(FAILED|ERROR) ' "$LOG/${ln}_$b.txt" | cut -c1-300 | sed "s/^/    /" >> "$LOG/failures_${ln}.txt"
  done
}

check() {
  rm -rf "$SCRATCH"; mkdir -p "$SCRATCH"; cp -r "$REPO/tests" "$SCRATCH/"; cd "$SCRATCH" || return 1
  rm -f "$LOG"/failures_*.txt
  say import "$(nice -n 15 $TO "$PY" -c 'import tfdp_utils,tensorflow as tf,keras;print(tfdp_utils.__file__.replace("'"$VENV"'","$VENV"),"tf",tf.__version__,"keras",keras.__version__)' 2>&1 | tail -1)"
  case ",${SKIP:-}," in *,demo,*) ;; *)
    timed demo "$VENV/bin/tfdp-utils" demo
    say demo "rc=$RC ${T}s $(grep -E 'Test accuracy' "$LOG/demo.txt" | tail -1 | cut -c1-60) $(grep -E 'Training time' "$LOG/demo.txt" | tail -1) $( [ $RC != 0 ] && grep -E 'error:|Error|Exception' "$LOG/demo.txt" | tail -1 | cut -c1-200)"
    TF_USE_LEGACY_KERAS=1 timed demo_legacy "$VENV/bin/tfdp-utils" demo
    say demo-legacy "rc=$RC ${T}s $(grep -E 'Test accuracy' "$LOG/demo_legacy.txt" | tail -1 | cut -c1-60) $(grep -E 'Training time' "$LOG/demo_legacy.txt" | tail -1) $( [ $RC != 0 ] && grep -E 'error:|Error|Exception' "$LOG/demo_legacy.txt" | tail -1 | cut -c1-200)";;
  esac
  case ",${SKIP:-}," in *,doctor,*) ;; *)
    timed doctor "$VENV/bin/tfdp-utils" doctor
    say doctor "rc=$RC ${T}s $(grep -iE 'verdict' "$LOG/doctor.txt" | tail -1 | cut -c1-140)"
    TF_USE_LEGACY_KERAS=1 timed doctor_legacy "$VENV/bin/tfdp-utils" doctor
    say doctor-legacy "rc=$RC ${T}s $(grep -iE 'verdict' "$LOG/doctor_legacy.txt" | tail -1 | cut -c1-140)";;
  esac
  case ",${SKIP:-}," in *,smoke,*) ;; *) pyt smoke smoke ;; esac
  case ",${SKIP:-}," in *,smoke_legacy,*) ;; *) TF_USE_LEGACY_KERAS=1 pyt smoke-legacy smokeL -m keras ;; esac
}

case $1 in
  build) build ;;
  reinstall) reinstall ;;
  check) check ;;
  all) build && check ;;
esac
exit 0
