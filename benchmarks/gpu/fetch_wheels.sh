#!/usr/bin/env bash
# Downloads the wheels of benchmarks/gpu/wheels.txt for the GPU image
# (CPython 3.12, manylinux x86_64) into benchmarks/gpu/wheels/ (ignored by
# git; it travels with the working tree), then prints their total size and
# the size of the working tree that travels with them (64 MiB at most).
#
#   bash benchmarks/gpu/fetch_wheels.sh [DEST]
#   DREAM_SRC=DIR bash benchmarks/gpu/fetch_wheels.sh   # also copy Dream's
#       reference HF code (configuration_dream.py, modeling_dream.py,
#       generation_utils.py) from DIR into DEST/dream_hf/
#
# Needs pip and a package registry; nothing else is downloaded. Packages
# published as source only (marked '# sdist' in wheels.txt) are built here
# into pure-Python wheels (py3-none-any), which install on any Python 3.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
dest=${1:-$here/wheels}
python=${PYTHON:-python3}
list=$here/wheels.txt
mkdir -p "$dest"

# name==version of every line (comments and markers dropped).
source "$here/wheel_pins.sh"
sdist=$(marked_pins "$list" sdist)
binary=$(wheel_pins "$list" sdist)

# Old downloads of other versions would make two candidates of one package.
rm -f "$dest"/*.whl

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
"$python" -m pip download --quiet --disable-pip-version-check --no-deps \
  --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --dest "$dest" $binary
# Source archives are checked against wheels.sha256 before they are built;
# a fixed SOURCE_DATE_EPOCH makes the wheel's bytes (and hash) reproducible.
sources=$(mktemp -d)
trap 'rm -rf "$sources"' EXIT
for pin in $sdist; do
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --no-binary :all: --dest "$sources" "$pin"
done
if [ -n "$sdist" ]; then
  (cd "$sources" && grep -E '^[0-9a-f]{64}  [^/]+\.(tar\.gz|zip)$' "$here/wheels.sha256" \
     | sha256sum --quiet -c -) || {
    echo "fetch_wheels.sh: a source archive is not as wheels.sha256 says" >&2
    exit 1
  }
  for archive in "$sources"/*; do
    SOURCE_DATE_EPOCH=315532800 "$python" -m pip wheel --quiet \
      --disable-pip-version-check --no-deps --wheel-dir "$dest" "$archive"
  done
fi
for whl in "$dest"/*.whl; do
  case "$whl" in
    *-cp312-*|*-abi3-*|*-none-any.whl) ;;
    *) echo "fetch_wheels.sh: $whl is not for CPython 3.12" >&2; exit 1 ;;
  esac
done
count=$(ls "$dest"/*.whl | wc -l)
expected=$(wheel_pins "$list" | wc -l)
if [ "$count" -ne "$expected" ]; then
  echo "fetch_wheels.sh: $count wheels for $expected pins in $list" >&2
  exit 1
fi

# Every wheel as wheels.sha256 says (what run.sh checks before installing).
if ! bash "$here/check_wheels.sh" "$dest"; then
  # A version's wheel on PyPI never changes, so a mismatch there means
  # wheels.txt and wheels.sha256 were not changed together; a wheel built
  # from a checked '# sdist' archive can differ when its build tools do.
  echo "fetch_wheels.sh: change wheels.sha256 with wheels.txt; for a wheel" \
       "built from a checked source archive, check it, then replace its line" \
       "with: (cd $dest && sha256sum NAME)" >&2
  exit 1
fi

if [ -n "${DREAM_SRC:-}" ]; then
  mkdir -p "$dest/dream_hf"
  for f in configuration_dream.py modeling_dream.py generation_utils.py; do
    cp "$DREAM_SRC/$f" "$dest/dream_hf/$f"
  done
  : > "$dest/dream_hf/__init__.py"
fi
if [ -d "$dest/dream_hf" ]; then
  if (cd "$dest/dream_hf" && sha256sum --quiet -c "$here/dream_hf.sha256"); then
    echo "Dream reference code: $dest/dream_hf (sha256 as dream_hf.sha256)"
  else
    echo "Dream reference code: $dest/dream_hf differs from dream_hf.sha256" \
         "(another copy of Dream's HF files; the figures will say so)"
  fi
else
  echo "Dream reference code: none (DREAM_SRC=DIR copies it; see README.md):" \
       "on the GPU, run.sh's Dream figures then have no PyTorch side (with" \
       "--smoke it times the project's own PyTorch port)"
fi

wheels_bytes=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
# What travels: tracked and untracked-not-ignored files, plus this folder.
tree_bytes=$(cd "$repo" && git ls-files -z --cached --others --exclude-standard \
  | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
carried_bytes=$(du -sb "$dest" | cut -f1)
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "wheels: $count files, $(mib "$wheels_bytes") in $dest"
echo "travels: working tree $(mib "$tree_bytes") + $(basename "$dest")/" \
     "$(mib "$carried_bytes") = $(mib $((tree_bytes + carried_bytes)))" \
     "(limit 64 MiB)"
if [ $((tree_bytes + carried_bytes)) -gt $((64 * 1048576)) ]; then
  echo "fetch_wheels.sh: over the 64 MiB that may travel" >&2
  exit 1
fi
