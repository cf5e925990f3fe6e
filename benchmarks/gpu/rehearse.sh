#!/usr/bin/env bash
# The GPU run rehearsed on a CPU host, under the GPU machine's own software
# (benchmarks/gpu/README.md, "Rehearsal"):
#
#   bash benchmarks/gpu/rehearse.sh OUTDIR [--steps=venv,smoke,compile,registers]
#
# venv       a Python 3.12 venv with image.txt's pins (JAX 0.11, its CUDA
#            plugin for compiling only, torch 2.11 with Triton, ...), at
#            TRM_IMAGE_VENV (default /tmp/trm_image); rebuilt only when
#            image.txt changed (about 7 GB, a few minutes from the registry)
# smoke      run.sh OUTDIR/smoke --smoke with that interpreter: the carried
#            wheels installed as on the device, then the sections the next
#            GPU run names (README.md; TRM_REHEARSE_ONLY, default
#            smoke,mixer,trm,gptk,gpt,dream, with both Triton TRM variants
#            and GPT's cudnn and cudnn_triton) on the CPU, torch's side
#            included; fails if any side failed inside a section
# compile    offline.py: the kit's Pallas Triton programs (TRM's MLP-t and
#            attention steps, GPT's iterations; TRM's again with the
#            epilogue and channel kernels) compiled for an H100 by the
#            device's XLA and Triton, without a GPU, and forecast
# registers  kernel_report.py: registers, spills and occupancy of every
#            Pallas kernel setting the sweeps time, from the device's ptxas
#
# Why: the CPU tests run JAX 0.10; the device runs 0.11, whose Pallas,
# Triton and XLA differ. A device minute spent finding that out is lost.
#
# Environment: PYTHON312 (default python3.12, or pyenv's 3.12), TRM_IMAGE_VENV.
# Exit status 0 only if every step passed; OUTDIR/rehearse.txt lists them.
set -uo pipefail

usage() { echo "usage: $0 OUTDIR [--steps=venv,smoke,compile,registers]" >&2; exit 2; }
[ $# -ge 1 ] || usage
out=$1; shift
steps="venv,smoke,compile,registers"
for arg in "$@"; do
  case "$arg" in
    --steps=*) steps=${arg#--steps=} ;;
    *) usage ;;
  esac
done
for step in ${steps//,/ }; do
  case "$step" in venv|smoke|compile|registers) ;; *) echo "$0: unknown step '$step' (venv, smoke, compile, registers)" >&2; exit 2 ;; esac
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${TRM_IMAGE_VENV:-/tmp/trm_image}
case "$out" in ''|-*) usage ;; esac
# Never the filesystem root's rehearse.txt: an OUTDIR that is a file (or
# cannot be made) stops here.
given=$out
if ! mkdir -p -- "$out" 2> /dev/null || ! out=$(cd -- "$out" && pwd); then
  echo "$0: OUTDIR $given is not a directory that can be made or entered" >&2
  exit 2
fi
summary=$out/rehearse.txt
: > "$summary"
say() { echo "[$(date +%H:%M:%S)] rehearse.sh: $*" | tee -a "$summary"; }
has() { [[ ",$steps," == *",$1,"* ]]; }
failed=()
py=$venv/bin/python

# ---------------------------------------------------------------- venv
stamp=$venv/image.txt
if has venv; then
  if [ -x "$py" ] && cmp -s "$here/image.txt" "$stamp"; then
    say "venv: $venv already holds image.txt's pins"
  elif [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
    # It is replaced whole: never a directory that is not a venv.
    say "venv: FAILED ($venv exists and is not a venv: set TRM_IMAGE_VENV to a new path)"
    failed+=(venv)
  else
    is312() { [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2> /dev/null; }
    python312=""
    if [ -n "${PYTHON312:-}" ]; then
      candidates=("$PYTHON312")  # the caller's choice, or nothing
    else
      candidates=(python3.12 "$(command -v pyenv > /dev/null && PYENV_VERSION=$(pyenv versions --bare | grep -m1 '^3\.12') pyenv which python3.12 2>/dev/null)")
    fi
    for candidate in "${candidates[@]}"; do
      if is312 "$candidate"; then
        python312=$candidate; break
      fi
    done
    if [ -z "$python312" ]; then
      say "venv: FAILED (no Python 3.12${PYTHON312:+ (PYTHON312=$PYTHON312 is not one)}: set PYTHON312=/path/to/python3.12)"
      failed+=(venv)
    else
      t0=$(date +%s)
      rm -rf "$venv"
      pins=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$here/image.txt" | awk NF)
      if "$python312" -m venv "$venv" \
          && "$py" -m pip install --quiet --disable-pip-version-check $pins \
             > "$out/venv_pip.log" 2>&1; then
        cp "$here/image.txt" "$stamp"
        say "venv: $("$py" --version) with image.txt's pins in $(( $(date +%s) - t0 )) s"
      else
        say "venv: FAILED (pip: $out/venv_pip.log)"
        failed+=(venv)
      fi
    fi
  fi
fi
if [ ! -x "$py" ]; then
  say "no venv at $venv: run with --steps=venv first"
  exit 1
fi
"$py" - <<'EOF' 2>&1 | tee -a "$summary"
import importlib.metadata as md, sys
names = ("jax", "jaxlib", "jax-cuda13-plugin", "flax", "optax",
         "orbax-checkpoint", "numpy", "torch", "triton", "transformers")
def version(name):
  try:
    return md.version(name)
  except md.PackageNotFoundError:
    return "not installed"
print("  python " + sys.version.split()[0] + ", " + ", ".join(
    f"{n} {version(n)}" for n in names))
EOF

# ---------------------------------------------------------------- smoke
if has smoke; then
  # run.sh installs the carried wheels into its own scratch dir, as on the
  # device; its log is OUTDIR/smoke/log.txt. The sections' arguments are
  # the next GPU run's (a caller's TRM_GPU_ARGS_* win).
  if PYTHON=$py \
      TRM_GPU_ARGS_TRM=${TRM_GPU_ARGS_TRM:---trm_variants=mlp_t_sudoku_triton,att_maze_triton} \
      TRM_GPU_ARGS_GPT=${TRM_GPU_ARGS_GPT:---gpt_variants=cudnn,cudnn_triton} \
      bash "$here/run.sh" "$out/smoke" --smoke \
      --only="${TRM_REHEARSE_ONLY:-smoke,mixer,trm,gptk,gpt,dream}" > /dev/null 2>&1; then
    # A side that failed inside a section (run.sh goes on without it, as it
    # must on the device) fails the rehearsal: session 77's run passed with
    # Dream's torch side failing on another copy of its HF code.
    sides=$(grep -E ' failed \(' "$out/smoke/log.txt" | head -3 | cut -c1-240)
    if [ -n "$sides" ]; then
      say "smoke: FAILED ($(grep -cE ' failed \(' "$out/smoke/log.txt") side(s) failed inside the sections: $(echo "$sides" | tr '\n' ' '))"
      failed+=(smoke)
    else
      say "smoke: passed ($(wc -l < "$out/smoke/figures.jsonl") figures; $out/smoke/log.txt)"
    fi
    grep -h 'NOT the pinned copy' "$out/smoke/log.txt" | head -1 | sed 's/^/  warning: /' | tee -a "$summary"
  else
    say "smoke: FAILED ($(grep -E 'run.sh: (install|section).*(FAILED|exit [^0])' "$out/smoke/log.txt" | tr '\n' ' '))"
    failed+=(smoke)
  fi
fi

# The compile steps import the project's dependencies from the carried
# wheels (as run.sh installs them; Dream's transformers 4.x and the
# protobuf floor are not needed here).
site=$out/site
if has compile || has registers; then
  source "$here/wheel_pins.sh"
  wheel_pins=$(wheel_pins "$here/wheels.txt" hf floor)
  rm -rf "$site"
  no_wheels() {
    say "wheels: FAILED ($1); compile and registers skipped"
    failed+=(wheels)
    steps=$(echo ",$steps," | sed -e 's/,compile,/,/' -e 's/,registers,/,/' -e 's/^,//' -e 's/,$//')
  }
  if ! checked=$(bash "$here/check_wheels.sh" "${TRM_GPU_WHEELS:-$here/wheels}"); then
    no_wheels "${checked#check_wheels.sh: }"
  elif ! "$py" -m pip install --disable-pip-version-check --no-index --no-deps \
      --no-compile --quiet --find-links "${TRM_GPU_WHEELS:-$here/wheels}" \
      --target "$site" $wheel_pins > "$out/site_pip.log" 2>&1; then
    no_wheels "$out/site_pip.log; fetch_wheels.sh fetches them"
  fi
fi

# ---------------------------------------------------------------- compile
if has compile; then
  # Twice: the kernels' own constants, then TRM's other layouts (the
  # epilogue kernels and the channel MLP's), which the sweep may choose.
  # A program that does not compile prints "did not compile"; offline.py
  # itself goes on, so its output is checked here.
  ok=1
  for setting in "" "forward=epi_t128_w8,dx=epi_t128_w8,grad=c16_w8,channel=epi"; do
    if [ -z "$setting" ]; then
      name=compile; args=(--only=trm,gpt)
    else
      name=compile_epilogue; args=(--only=trm "--mixer_setting=$setting")
    fi
    PYTHONPATH=$site "$py" "$here/offline.py" --out="$out/$name" "${args[@]}" \
      --match=triton > "$out/$name.txt" 2>&1
    rc=$?
    programs=$(grep -cE '^(trm|gpt)/.* GiB  forecast' "$out/$name.txt")
    if [ $rc = 0 ] && [ "$programs" -gt 0 ] && ! grep -q 'did not compile' "$out/$name.txt"; then
      say "compile${setting:+ ($setting)}: $programs Pallas Triton programs compiled for an H100 ($out/$name.txt)"
      grep -E '^(trm|gpt)/' "$out/$name.txt" | sed 's/^/  /' | tee -a "$summary" > /dev/null
    else
      say "compile${setting:+ ($setting)}: FAILED (exit $rc, $programs programs; $out/$name.txt)"
      ok=0
    fi
  done
  [ $ok = 1 ] || failed+=(compile)
fi

# ---------------------------------------------------------------- registers
if has registers; then
  ok=1
  for args in "--batch=768" "--gpt"; do
    name=registers_${args//[-=]/}
    PYTHONPATH=$site "$py" "$here/kernel_report.py" $args > "$out/$name.txt" 2>&1
    rc=$?
    # kernel_report.py warns on stderr (into the same file) when a setting's
    # kernel is missing from its program.
    if [ $rc != 0 ] || grep -q 'no kernel named' "$out/$name.txt"; then
      ok=0
      say "registers $args: FAILED (exit $rc; $out/$name.txt)"
    else
      spills=$(awk '$4 ~ /^[0-9]+\/[0-9]+$/ && $4 != "0/0"' "$out/$name.txt" | wc -l)
      say "registers $args: $(grep -cE ' [0-9.]+% ' "$out/$name.txt") kernels, $spills spilling ($out/$name.txt)"
    fi
  done
  [ $ok = 1 ] || failed+=(registers)
fi

if [ ${#failed[@]} = 0 ]; then
  say "passed: $steps"
  exit 0
fi
say "FAILED: ${failed[*]}"
exit 1
