"""The collectives a compiled program's text holds, for tests that check
what a step moves between devices."""
import re

# An HLO collective's opcode (its async -start form too), as it follows
# its result's shape on the instruction's line.
COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|"
                        r"all-to-all|collective-permute)(-start)?\(")


def collectives(hlo: str) -> list[tuple[str, str]]:
  """(opcode without -start, its line) for every collective in `hlo`."""
  return [(m.group(1), line) for line in hlo.splitlines()
          for m in COLLECTIVE.finditer(line)]


def results(hlo: str) -> list[tuple[str, str]]:
  """(opcode without -start, its result's type, a tuple's whole) for every
  collective in `hlo`, e.g. ('all-reduce', 'f32[768,512]{1,0}')."""
  found = []
  for line in hlo.splitlines():
    _, eq, rhs = line.partition(" = ")
    for m in COLLECTIVE.finditer(rhs if eq else ""):
      found.append((m.group(1), rhs[:m.start()].strip()))
  return found
