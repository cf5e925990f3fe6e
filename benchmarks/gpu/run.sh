#!/usr/bin/env bash
# The GPU figures of issue 26 in one command (benchmarks/gpu/README.md):
#
#   bash benchmarks/gpu/run.sh OUTDIR [--smoke] [--only=smoke,trm,gpt,dream[,cudnn][,mixer][,gptk]]
#
# 1. installs the carried wheels (benchmarks/gpu/wheels, fetch_wheels.sh)
#    into a scratch --target dir, Dream's transformers 4.x into another, and
#    the project itself with --no-deps; nothing is fetched;
# 2. runs benchmarks/gpu/measure.py once per section, each under its own
#    `timeout`, appending one JSON line per figure to OUTDIR/figures.jsonl;
#    everything printed also goes to OUTDIR/log.txt.
#
# --smoke: tiny sizes, JAX and torch on the CPU (4-6 minutes on 2 cores).
# The whole GPU run is budgeted to end within 8 minutes:
#   install ~15 s, smoke 50 s, trm 165 s, gpt 100 s, dream 150 s
# (TRM_GPU_BUDGET_<SECTION>=seconds overrides one); what a section leaves
# unused carries over to the next. The 8 minutes are counted from run.sh's
# start, the install included: a section's time is cut to what is left of
# them (TRM_GPU_TOTAL=seconds overrides; --smoke: 1800), less 15 s for
# timeout's --kill-after and the end (the programs' archive).
#
# Environment:
#   TRM_GPU_INSTALL=1 (default) install | dry (pip --dry-run for CPython 3.12
#     manylinux, nothing installed; the packages must already import)
#     | 0 (skip: the packages already import)
#   TRM_GPU_ARGS_<SECTION>="..."  more arguments for that section's
#                        measure.py (e.g. TRM_GPU_ARGS_TRM="--trm_batch=96
#                        --trm_variants=att_maze"); sections run in --only's order
#   TRM_GPU_SCRATCH=DIR  scratch dir, kept (default: a new one under /tmp,
#                        removed at the end)
#   TRM_GPU_WHEELS=DIR   wheels (default benchmarks/gpu/wheels)
#   PYTHON=python3       the interpreter (the image's python3 holds torch)
set -uo pipefail
started=$(date +%s)  # the total counts from here, the install included

usage() { echo "usage: $0 OUTDIR [--smoke] [--only=SECTION,...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
out=$1; shift
smoke=0
# cudnn (cuDNN against dot attention, forwards only; measured in the first
# H100 runs) and mixer (the Triton token mixer's constants swept against
# XLA, benchmarks/gpu/mixer_sweep.py) run when named.
only="smoke,trm,gpt,dream"
for arg in "$@"; do
  case "$arg" in
    --smoke) smoke=1 ;;
    --only=*) only=${arg#--only=} ;;
    *) usage ;;
  esac
done

# Bad input stops the run here, in one line, before anything is installed,
# measured or written.
die() { echo "run.sh: $*" >&2; exit 2; }
case "$out" in
  ''|-*) die "OUTDIR '$out' must come first and not start with '-' (usage: run.sh OUTDIR [--smoke] [--only=...])" ;;
esac
[ -n "${only//[, ]/}" ] || die "--only='$only' names no section (smoke, trm, gpt, dream, cudnn, mixer, gptk)"
for section in ${only//,/ } TOTAL; do
  var=TRM_GPU_BUDGET_$(echo "$section" | tr a-z A-Z | tr -c 'A-Z0-9_\n' _)
  [ "$section" != TOTAL ] || var=TRM_GPU_TOTAL
  value=${!var-}
  # A whole number of seconds: bash's arithmetic would read 'abc' as an
  # unset variable, '1e3' as an error that skips every section, 0 as
  # timeout's "no limit", and 20 digits as an overflow.
  if [ -n "${!var+set}" ] && ! [[ $value =~ ^[0-9]{1,5}$ && 10#$value -ge 1 && 10#$value -le 86400 ]]; then
    die "$var='$value' must be a whole number of seconds from 1 to 86400"
  fi
  [ "$section" != TOTAL ] || continue
  # run.sh sets these itself: measure.py would take the last one given, so
  # --budget=1000 here would outlive the section's `timeout` and be killed
  # with nothing written, and --out would hide the figures from this run.
  var=TRM_GPU_ARGS_${var#TRM_GPU_BUDGET_}
  for arg in ${!var-}; do
    case "$arg" in
      --out|--out=*|--budget|--budget=*)
        die "$var: ${arg%%=*} is run.sh's own (OUTDIR; TRM_GPU_BUDGET_${var#TRM_GPU_ARGS_} for the seconds)" ;;
    esac
  done
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
python=${PYTHON:-python3}
wheels=${TRM_GPU_WHEELS:-$here/wheels}
[ ! -d "$wheels" ] || wheels=$(cd -- "$wheels" && pwd)  # the sections run in $repo
install=${TRM_GPU_INSTALL:-1}
[ ! -e "$out" ] || [ -d "$out" ] || die "OUTDIR $out exists and is not a directory"
mkdir -p -- "$out" 2> /dev/null || die "OUTDIR $out: cannot create it"
out=$(cd -- "$out" && pwd) || die "OUTDIR $out: cannot enter it"
probe=$out/.run_sh_write_test.$$
{ : > "$probe"; } 2> /dev/null && rm -f "$probe" || die "OUTDIR $out is not writable"
# OUT holds one run: the previous run's traces and programs would pass for
# this run's (and its traces count against MAX_TRACES), so they go.
stale=$(cd "$out" && ls -d -- trace_*.tar.gz hlo_after_optimizations.tar.gz 2> /dev/null | tr '\n' ' ')
rm -f -- "$out"/trace_*.tar.gz "$out/hlo_after_optimizations.tar.gz"
: > "$out/log.txt"
if [ -n "${TRM_GPU_SCRATCH:-}" ]; then
  scratch=$TRM_GPU_SCRATCH
  mkdir -p "$scratch"
else
  scratch=$(mktemp -d /tmp/trm_gpu.XXXXXX)
  trap 'rm -rf "$scratch"' EXIT
fi
: > "$out/figures.jsonl"
exec > >(tee -a "$out/log.txt") 2>&1
tee_pid=$!
say() { echo "[$(date +%H:%M:%S)] run.sh: $*"; }

say "out $out, scratch $scratch, smoke $smoke, sections $only, install $install"
[ -z "$stale" ] || say "out: removed the previous run's $stale"
say "repo $repo at $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$repo" diff --quiet 2>/dev/null || echo ' (+ local changes)')"
say "$($python --version 2>&1) at $(command -v "$python")"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | sed 's/^/  gpu: /'

# ------------------------------------------------------------------ install
source "$here/wheel_pins.sh"
hf_pins=$(marked_pins "$here/wheels.txt" hf)
site_pins=$(wheel_pins "$here/wheels.txt" hf)
# '# floor' pins: only where the interpreter's own version is older (a dry
# run resolves them all, to check the wheels).
for pin in $(marked_pins "$here/wheels.txt" floor); do
  have=$("$python" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: print('')" "${pin%%==*}")
  if [ -n "$have" ] && "$python" -c "import sys; from packaging.version import Version as V; sys.exit(V(sys.argv[1]) < V(sys.argv[2]))" "$have" "${pin#*==}"; then
    say "install: ${pin%%==*} $have >= ${pin#*==}: the interpreter's"
    [ "$install" = dry ] || site_pins=$(echo "$site_pins" | grep -vxF "$pin")
  else
    say "install: ${pin%%==*} ${have:-none} < ${pin#*==}: the carried wheel"
  fi
done
pip=("$python" -m pip install --disable-pip-version-check --no-index
     --no-deps --no-compile --quiet --find-links "$wheels")
foreign=()
if [ "$install" = dry ]; then
  # Resolve the pins against the wheels as the image's CPython 3.12 would.
  foreign=(--dry-run --only-binary=:all: --python-version 3.12
           --implementation cp)
  for p in manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
           manylinux2014_x86_64; do
    foreign+=(--platform "$p")
  done
fi
install_ok=1
if [ "$install" = 0 ]; then
  say "install: skipped (TRM_GPU_INSTALL=0)"
else
  t0=$(date +%s)
  n_site=$(echo "$site_pins" | wc -w)
  n_hf=$(echo "$hf_pins" | wc -w)
  say "install: $n_site pins into $scratch/site, $n_hf into $scratch/hf, from $wheels"
  # Nothing installs from a folder whose wheels are not wheels.sha256's.
  if checked=$(bash "$here/check_wheels.sh" "$wheels"); then
    say "install: ${checked#check_wheels.sh: }"
    wheels_ok=1
  else
    say "install: wheels FAILED (${checked#check_wheels.sh: }); nothing installed from them"
    wheels_ok=0
    install_ok=0
  fi
  echo "  + ${pip[*]} ${foreign[*]} --target $scratch/site" $site_pins
  if [ "$wheels_ok" = 0 ]; then
    say "install: site FAILED (wheels not checked)"
  elif "${pip[@]}" "${foreign[@]}" --target "$scratch/site" $site_pins; then
    say "install: site: all $n_site pins resolved$([ "$install" = dry ] && echo ' (dry run)')"
  else
    install_ok=0
    say "install: site FAILED ($( [ -d "$wheels" ] && echo "wheels in $wheels" || echo "no $wheels: run fetch_wheels.sh" ))"
  fi
  echo "  + ${pip[*]} ${foreign[*]} --target $scratch/hf" $hf_pins
  if [ "$wheels_ok" = 0 ]; then
    say "install: hf FAILED (wheels not checked)"
  elif "${pip[@]}" "${foreign[@]}" --target "$scratch/hf" $hf_pins; then
    say "install: hf: all $n_hf pins resolved$([ "$install" = dry ] && echo ' (dry run)')"
  else
    install_ok=0
    say "install: hf FAILED"
  fi
  # The project itself, without its dependencies (they are above or in the
  # image), built from setup.py with the image's setuptools.
  project=("$python" -m pip install --disable-pip-version-check --no-index
           --no-deps --no-build-isolation --no-compile --quiet)
  [ "$install" = dry ] && project+=(--dry-run)
  echo "  + ${project[*]} --target $scratch/site $repo"
  if "${project[@]}" --target "$scratch/site" "$repo"; then
    say "install: project: trm$([ "$install" = dry ] && echo ' (dry run)')"
  else
    install_ok=0
    say "install: project FAILED"
  fi
  say "install: $(( $(date +%s) - t0 )) s"
fi
if [ "$install" = 1 ]; then
  export PYTHONPATH="$scratch/site:$repo${PYTHONPATH:+:$PYTHONPATH}"
  hf_path="$scratch/hf:$PYTHONPATH"
else
  export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
  hf_path="$PYTHONPATH"
fi
# What the sections will import (versions from the installed metadata; the
# project's stack imported for real, torch's and TensorFlow's only looked up).
"$python" - <<'EOF' 2>&1 | sed 's/^/  /'
import importlib, importlib.metadata as md
# (image.txt pins the image's own packages to what these lines say.)
for name in ("jax", "jaxlib", "jax-cuda13-plugin", "flax", "optax",
             "orbax-checkpoint", "clu", "grain", "tensorflow-datasets",
             "ml-collections", "tensorboard", "protobuf", "numpy",
             "ml-dtypes", "absl-py", "safetensors", "filelock", "torch",
             "triton", "transformers", "tokenizers", "tensorflow",
             "tensorflow-cpu"):
  try:
    print(f"{name} {md.version(name)}")
  except md.PackageNotFoundError:
    print(f"{name}: not installed")
for module in ("clu.metrics", "grain", "tensorflow_datasets", "ml_collections",
               "trm.core.metrics", "clu.metric_writers"):
  if md.packages_distributions().get("tensorflow"):
    break  # TensorFlow would load with them (seconds); the GPU image has none
  try:
    importlib.import_module(module)
  except Exception as e:  # pylint: disable=broad-except
    print(f"import {module}: FAILED ({type(e).__name__}: {e})")
EOF

if [ "$smoke" = 0 ] && [[ ",$only," == *,dream,* ]] && [ ! -f "$wheels/dream_hf/modeling_dream.py" ]; then
  say "dream: no Dream HF code in $wheels/dream_hf: the Dream figures will have no PyTorch side (fetch_wheels.sh with DREAM_SRC=DIR)"
fi

# ----------------------------------------------------------------- sections
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX and torch share the GPU
export PYTHONUNBUFFERED=1
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-1}
mode=()
if [ "$smoke" = 1 ]; then
  export JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES=
  # Forced host devices (the tests' 8) would split the CPU figures.
  export XLA_FLAGS=$(echo "${XLA_FLAGS:-}" | sed -E 's/--xla_force_host_platform_device_count=[0-9]+//g')
  mode=(--smoke)
  # Caps for a shared 2-core CPU; an idle one needs about half.
  declare -A budget=([smoke]=200 [trm]=200 [gpt]=120 [dream]=150 [cudnn]=20
                     [mixer]=60 [gptk]=60)
  total=${TRM_GPU_TOTAL:-1800}
else
  # From the H100 runs (benchmarks/gpu/results/): smoke took 35 s on
  # 2026-11-26 and did not finish in 40 or 45 s on 2026-11-27 (a fresh
  # machine's JAX start and compile: 22 s to the first step); TRM about 85 s
  # per variant from its first batch (torch.compile of upstream's step
  # 42-58 s); GPT 104 s with three rounds (ours' first iteration 42 s,
  # torch.compile 35 s); Dream's batch 1 about 70 s (ours' exact sampler
  # compiles in 42 s), batch 16 more; cudnn 30-45 s; mixer: 14 s to the
  # XLA path's figures, then 4-8 s per setting, mostly compiles (now one
  # program per setting: about 4 s, 19 settings). Third run
  # (2026-11-27, session 39): smoke 36 s; TRM 100 s for the Triton variant
  # at 768; GPT 132 s with two variants of ours; Dream 166 s for batches 1
  # and 16 with HF's batch 16 out of memory (batch 16's exact sampler
  # compiled in 11-60 s). The sum is the 8 minutes; all of the default
  # sections need about 9.5, so TRM's second variant or Dream's batch 16
  # may be cut short (benchmarks/gpu/README.md). Mixer: 150 s, 20 s more
  # than 14 + 23 x 5 s, as the new layouts' compile times are unmeasured.
  # gptk (GPT-2's two Pallas kernels alone, 10 small programs; not yet run
  # on a GPU): 45 s.
  declare -A budget=([smoke]=50 [trm]=165 [gpt]=100 [dream]=150 [cudnn]=40
                     [mixer]=170 [gptk]=45)
  # Issue 26's 8 minutes, from run.sh's start: the install (14-16 s on the
  # H100) and the version check count too.
  total=${TRM_GPU_TOTAL:-480}
fi
total=$((10#$total))  # checked above
# What the run keeps after the last section's `timeout`: its --kill-after
# (10 s) and the end (the programs' archive, the listing).
tail_s=15
# Ours' compiled train steps and samplers, as XLA optimized them (on the GPU:
# autotuned), for `offline.py --replay` to play and list hot spots off the
# device.
dump=$scratch/xla_dump
rm -rf "$dump"  # a kept TRM_GPU_SCRATCH holds an earlier run's programs
export XLA_FLAGS="${XLA_FLAGS:-} --xla_dump_to=$dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*(train_step|generate).*"
failed=()
spare=0  # seconds earlier sections left unused
cd "$repo"
for section in ${only//,/ }; do
  case "$section" in
    smoke|trm|gpt|dream|cudnn|mixer|gptk) ;;
    *) say "section $section: unknown (smoke, trm, gpt, dream, cudnn, mixer, gptk)"; failed+=("$section"); continue ;;
  esac
  var=TRM_GPU_BUDGET_$(echo "$section" | tr a-z A-Z)
  own=${!var:-${budget[$section]}}
  own=$((10#$own))  # checked above; 030 is 30 s, not octal 24
  seconds=$((own + spare))
  # The section's time never runs past the run's total (the install and
  # earlier overruns counted), so the run ends when it says it will.
  left=$((started + total - tail_s - $(date +%s)))
  cut=""
  if [ "$seconds" -gt "$left" ]; then
    if [ "$left" -lt 10 ]; then
      say "section $section: skipped: $((left > 0 ? left : 0)) s left of the run's $total s (TRM_GPU_TOTAL; the install counted)"
      failed+=("$section")
      continue
    fi
    cut=", cut to the $left s left of the run's $total s (TRM_GPU_TOTAL; the install counted)"
    seconds=$left
  fi
  var=TRM_GPU_ARGS_$(echo "$section" | tr a-z A-Z)
  read -r -a extra <<< "${!var:-}"
  path=$PYTHONPATH
  own_args=()
  if [ "$section" = dream ]; then
    path=$hf_path
    # Dream's HF code travels in the wheels folder (fetch_wheels.sh DEST
    # with DREAM_SRC), wherever TRM_GPU_WHEELS puts it; measure.py's own
    # default is benchmarks/gpu/wheels/dream_hf.
    own_args=(--dream_hf="$wheels/dream_hf")
  fi
  say "section $section: up to $seconds s ($own s + $spare s carried over$cut)"
  t0=$(date +%s)
  PYTHONPATH=$path timeout --kill-after=10 "$seconds" "$python" \
    "$here/measure.py" "$section" --out="$out" --budget="$seconds" "${mode[@]}" \
    "${own_args[@]}" "${extra[@]}"
  rc=$?
  used=$(( $(date +%s) - t0 ))
  spare=$(( seconds > used ? seconds - used : 0 ))
  lines=$(grep -c "\"name\": \"$section/" "$out/figures.jsonl")
  say "section $section: exit $rc$([ $rc = 124 ] && echo ' (timeout)') after $used s, $lines figures"
  [ $rc = 0 ] || failed+=("$section")
done

optimized=$(cd "$dump" 2>/dev/null && ls -- *after_optimizations.txt 2>/dev/null)
if [ -n "$optimized" ]; then
  tar -C "$dump" -czf "$out/hlo_after_optimizations.tar.gz" $optimized
  size=$(stat -c %s "$out/hlo_after_optimizations.tar.gz")
  if [ "$size" -gt $((16 * 1024 * 1024)) ]; then
    rm -f "$out/hlo_after_optimizations.tar.gz"
    say "hlo: $(echo $optimized | wc -w) optimized programs, $size bytes gzipped: over 16 MiB, not kept"
  else
    say "hlo: $(echo $optimized | wc -w) optimized programs in hlo_after_optimizations.tar.gz ($size bytes; offline.py --replay)"
  fi
fi
figures=$(wc -l < "$out/figures.jsonl")
say "done in $(( $(date +%s) - started )) s: $figures figures in $out/figures.jsonl${failed[*]:+; failed: ${failed[*]}}"
ls -la "$out" | sed 's/^/  /'
status=0
[ "$install_ok" = 1 ] || [ "$install" = dry ] || status=1
[ ${#failed[@]} = 0 ] || status=1
exec 1>&- 2>&-
wait "$tee_pid" 2>/dev/null  # log.txt complete before we exit
exit $status
