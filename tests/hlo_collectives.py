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
