# The pins of wheels.txt, read one way for every script of the kit that
# installs or fetches them: sourced (not run) by run.sh, rehearse.sh and
# fetch_wheels.sh. A pin is a line's text before '#', spaces removed;
# blank and comment-only lines give none. A trailing '# MARKER' (hf,
# sdist, floor) says where it goes (wheels.txt's header).
#
#   wheel_pins FILE [MARKER...]   every pin, less those marked with a MARKER
#   marked_pins FILE MARKER       the pins marked '# MARKER'
#
# Both print one pin a line and succeed when there is none (set -e and
# pipefail callers).

_pin_text() { sed -e 's/#.*//' -e 's/[[:space:]]//g' | awk NF; }

wheel_pins() {
  local file=$1
  shift
  if [ $# -eq 0 ]; then
    _pin_text < "$file"
  else
    { grep -vE "#[[:space:]]*($(IFS='|'; echo "$*"))" "$file" || true; } | _pin_text
  fi
}

marked_pins() {
  { grep -E "#[[:space:]]*$2" "$1" || true; } | _pin_text
}
