#!/usr/bin/env bash
# Checks a wheels folder against wheels.sha256 before anything installs
# from it: every wheel listed there is present with its hash, and no other
# wheel is there (pip's --find-links would pick an unlisted wheel of a
# pinned version whose platform tag it prefers).
#
#   bash benchmarks/gpu/check_wheels.sh [DIR]   # default: benchmarks/gpu/wheels
#
# Prints one line and exits 0 when the folder passes; otherwise one line
# naming the first files at fault, and exits 1.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/wheels}
sums=$here/wheels.sha256

if [ ! -d "$dir" ]; then
  echo "check_wheels.sh: no $dir: run fetch_wheels.sh"
  exit 1
fi
listed=$(grep -E '^[0-9a-f]{64}  [^/]+\.whl$' "$sums")
names=$(echo "$listed" | sed 's/^[0-9a-f]*  //')
unlisted=$(cd "$dir" && ls -- *.whl 2> /dev/null | grep -vxF -f <(echo "$names") || true)
if [ -n "$unlisted" ]; then
  echo "check_wheels.sh: $(echo $unlisted) in $dir not in wheels.sha256:" \
       "remove it, or fetch_wheels.sh again"
  exit 1
fi
bad=$(cd "$dir" && echo "$listed" | sha256sum -c - 2> /dev/null \
      | grep -v ': OK$' | sed 's/: .*//' || true)
if [ -n "$bad" ]; then
  echo "check_wheels.sh: $(echo $bad) in $dir missing or not as" \
       "wheels.sha256 says: fetch_wheels.sh again"
  exit 1
fi
echo "check_wheels.sh: $(echo "$names" | wc -l) wheels in $dir as wheels.sha256 says"
