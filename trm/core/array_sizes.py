"""Arrays no machine can hold, found in a lowered program before XLA
compiles it: XLA aborts the whole process (a C++ CHECK, exit 134) on a
shape whose size overflows, so `--config.block_size=1000000000` or a
prompt of 10^8 tokens ended in a core dump instead of a line naming
the sizes."""

import re

# One pebibyte: more than a whole v5p pod's memory (8,960 chips x 95 GiB),
# and 2**13 below 2**63 bytes, so that XLA:TPU's layouts, which pad the two
# minor dimensions to 8 x 128 (f32[8,2,L,L] was checked as f32[8,128,L,L]),
# cannot overflow.
LIMIT_BYTES = 2**50

_TENSOR = re.compile(r"tensor<((?:\d+x)+)([a-zA-Z]+(\d+)[\w]*)>")


def largest_array(module_text: str) -> tuple[list[int], str, int] | None:
  """(shape, element type, bytes) of the largest array in a StableHLO
  module's text, or None when it has no ranked array."""
  largest = None
  for match in _TENSOR.finditer(module_text):
    dims = [int(d) for d in match.group(1).split("x")[:-1]]
    size = max(1, int(match.group(3)) // 8)
    for d in dims:
      size *= d
    if largest is None or size > largest[2]:
      largest = (dims, match.group(2), size)
  return largest


def check_lowered(lowered, what: str, fix: str) -> None:
  """Raises ValueError naming the array when `lowered` (a `jax.stages.
  Lowered`) holds one of LIMIT_BYTES or more; `what` names the program
  ('the train step'), `fix` the sizes to lower."""
  largest = largest_array(lowered.as_text(debug_info=False))
  if largest is not None and largest[2] >= LIMIT_BYTES:
    shape, dtype, size = largest
    raise ValueError(
        f"{what} holds an array of {shape} {dtype} ({size / 2**50:.3g} PiB), "
        f"more than any machine holds (XLA would abort the process on it); "
        f"{fix}.")


def _dtype(leaf):
  """A leaf's dtype: a typed PRNG key's (key<fry>) is no numpy dtype, but
  it has an itemsize and a name as numpy's do."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  return leaf.dtype if hasattr(leaf.dtype, "itemsize") else np.dtype(
      leaf.dtype)


def _nbytes(shape, dtype) -> int:
  """Bytes of an array of `shape`; Python ints: np.prod would wrap at
  2**63."""
  size = dtype.itemsize
  for d in shape:
    size *= int(d)
  return size


def check_abstract(tree, what: str, fix: str) -> None:
  """As `check_lowered`, for a tree of abstract arrays (`jax.eval_shape`'s
  ShapeDtypeStructs) before anything is lowered: an initialiser drawing
  2**64 or more random values fails while lowering with JAX's bare
  NotImplementedError traceback."""
  import jax  # pylint: disable=g-import-not-at-top
  largest = None
  for leaf in jax.tree.leaves(tree):
    shape = getattr(leaf, "shape", None)
    if shape is None:
      continue
    dtype = _dtype(leaf)
    size = _nbytes(shape, dtype)
    if largest is None or size > largest[2]:
      largest = (list(shape), str(dtype), size)
  if largest is not None and largest[2] >= LIMIT_BYTES:
    shape, dtype, size = largest
    raise ValueError(
        f"{what} holds an array of {shape} {dtype} ({size / 2**50:.3g} PiB), "
        f"more than any machine holds; {fix}.")


def host_memory_bytes() -> int | None:
  """This host's memory and swap, or the cgroup's limit where that is
  lower; None where neither can be read."""
  import os  # pylint: disable=g-import-not-at-top
  try:
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError):
    total = None
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("SwapTotal:") and total is not None:
          total += int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  for path in ("/sys/fs/cgroup/memory.max",
               "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
    try:
      with open(path, encoding="ascii") as f:
        text = f.read().strip()
    except OSError:
      continue
    if text.isdigit() and (total is None or int(text) < total):
      total = int(text)
  return total


# The process limits that bound what XLA:CPU can allocate, lowest first
# wins: an allocation past either fails as past the host's memory does.
# Each with the /proc/self/status line of what the process holds against
# it already.
_PROCESS_LIMITS = (("RLIMIT_AS", "address-space limit (ulimit -v)", "VmSize:"),
                   ("RLIMIT_DATA", "data-segment limit (ulimit -d)",
                    "VmData:"))


def process_mapped_bytes() -> dict[str, int]:
  """{'VmSize:': bytes, 'VmData:': bytes} this process maps now (its
  /proc/self/status; {} where it cannot be read): counted against `ulimit
  -v` and `-d` before any new array (on our 2-core host about 1.4 GiB of
  address space once jax's CPU client has started, 2.0 with libtpu
  loaded; glibc's arenas and threads' stacks, so it varies by host)."""
  mapped = {}
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        key = line.split(maxsplit=1)[0] if line.strip() else ""
        if key in ("VmSize:", "VmData:"):
          mapped[key] = int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    return {}
  return mapped


def memory_bound(resident: int = 0) -> tuple[int, str] | None:
  """The most memory this process can hold, and the words that name it:
  the host's memory and swap (`host_memory_bytes`) or, where lower, the
  process's address-space or data-segment limit (each counts every
  private allocation XLA:CPU makes), less what the process maps against
  it already, except `resident` bytes of it: arrays that are counted in
  what is being checked and may exist already (a program's arguments),
  so as never to count them twice. None where none can be read."""
  import resource  # pylint: disable=g-import-not-at-top
  host = host_memory_bytes()
  bounds = [] if host is None else [
      (host, f"its {host / 2**30:,.1f} GiB (memory and swap)")]
  mapped = None
  for name, words, status_key in _PROCESS_LIMITS:
    try:
      soft, _ = resource.getrlimit(getattr(resource, name))
    except (AttributeError, ValueError, OSError):
      continue
    if soft == resource.RLIM_INFINITY or soft < 0:
      continue
    if mapped is None:
      mapped = process_mapped_bytes()
    # What the process maps already counts against the limit: a program
    # just under the limit as set failed at its first run.
    held = max(mapped.get(status_key, 0) - resident, 0)
    left = max(soft - held, 0)
    besides = " besides the program's arguments" if resident else ""
    bounds.append((left, f"the {left / 2**30:,.1f} GiB this process has "
                         f"left under its {soft / 2**30:,.1f} GiB "
                         f"{words[:-1]}; it maps {held / 2**30:,.1f} GiB "
                         f"already{besides})" if held else
                   f"this process's {soft / 2**30:,.1f} GiB {words}"))
  return min(bounds, key=lambda bound: bound[0]) if bounds else None


def check_host_memory(tree, what: str, fix: str) -> None:
  """On CPU devices (which all share this host's memory), raises
  ValueError when the arrays of `tree` (ShapeDtypeStructs carrying their
  shardings), as many copies as devices hold them, need more than the
  host has (`memory_bound`: its memory and swap, or the process's
  `ulimit -v` or `-d` where lower): a state past it was ended by the
  kernel's OOM killer with no message, or (a 128 GiB puzzle table) hung
  the start-up. Every process of a job that holds a part of `tree` raises
  when one does (`refuse_together`)."""
  import jax  # pylint: disable=g-import-not-at-top
  total, devices, spanned = 0, set(), set()
  for leaf in jax.tree.leaves(tree):
    shape, sharding = getattr(leaf, "shape", None), getattr(
        leaf, "sharding", None)
    if shape is None:
      continue
    placed = (sharding.device_set if sharding is not None
              else set(jax.local_devices()[:1]))
    # trm.aot's compile-only TPU devices, a GPU's or a TPU's own memory:
    # XLA's compile is the verdict there.
    if any(d.platform != "cpu" for d in placed):
      return
    spanned |= {d.process_index for d in placed}
    local = (set(sharding.addressable_devices) if sharding is not None
             else placed)
    devices |= local
    if sharding is not None:
      shape = sharding.shard_shape(shape)
    total += _nbytes(shape, _dtype(leaf)) * len(local)
  refuse_together(host_refusal(total, what, fix, len(devices)), what, fix,
                  spanned)


def host_refusal(total: int, what: str, fix: str, devices: int | None = None,
                 detail: str = "", resident: int = 0) -> str | None:
  """The refusal for `total` bytes past `memory_bound` (`resident` of them
  possibly held already), or None where they fit (or no bound can be
  read): bytes of this host's `devices` CPU devices (`detail` after
  them), or of host arrays (`devices` None)."""
  bound = memory_bound(resident)
  if bound is None or total <= bound[0]:
    return None
  if devices is None:
    where = f"of this host's memory, more than {bound[1]}"
  else:
    where = (f"on this host's {devices} CPU device(s){detail}, which share "
             f"{bound[1]}")
  return f"{what} needs {total / 2**30:,.1f} GiB {where}; {fix}."


def refuse_together(refusal: str | None, what: str, fix: str,
                    processes=None) -> None:
  """Raises ValueError(`refusal`) and, where the arrays or program span
  every process of a job (`processes`, default all: a host-side check
  every process makes at the same point), makes every process raise when
  one refuses: hosts of unequal memory judge alone, and the others went
  on into the next collective, to wait there until the refusing one was
  reported lost."""
  import jax  # pylint: disable=g-import-not-at-top
  count = jax.process_count()
  if processes is None:
    processes = set(range(count))
  if count > 1 and len(processes) == count:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    refused = np.asarray(multihost_utils.process_allgather(
        np.int32(refusal is not None))).ravel()
    others = [i for i, flag in enumerate(refused)
              if flag and i != jax.process_index()]
    if refusal is None and others:
      refusal = (f"{what} is past the memory of process {others[0]}'s host "
                 f"({len(others)} of {count} processes refused it; their "
                 f"error lines give the figures); {fix}.")
  if refusal is not None:
    raise ValueError(refusal)


def check_host_bytes(total: int, what: str, fix: str) -> None:
  """Host arrays (numpy, whatever the devices) of `total` bytes held to
  `memory_bound`, before they are made; every process of a job calls it at
  the same point and raises when one refuses (`refuse_together`)."""
  refuse_together(host_refusal(total, what, fix), what, fix)


def check_program_host_memory(compiled, devices, what: str, fix: str) -> None:
  """As `check_host_memory`, for a compiled program (`jax.stages.Compiled`)
  run on `devices`: on CPU devices XLA allocates its arguments, outputs
  (less those aliased to donated arguments) and temporaries
  (`memory_analysis()`, per device) in this host's memory (within the
  process's `ulimit -v` and `-d`), once for each of this process's
  devices. A program past it failed at its first run
  (XLA:CPU's "Out of memory allocating 126371977048 bytes" in a
  JaxRuntimeError traceback, or a C++ CHECK on a buffer it could not
  allocate, exit 134) or was ended by the OOM killer."""
  import jax  # pylint: disable=g-import-not-at-top
  local = [d for d in devices if d.process_index == jax.process_index()]
  if not local or any(d.platform != "cpu" for d in devices):
    return
  memory = compiled.memory_analysis()
  refusal = None
  if memory is not None:
    # A field a backend leaves out (or None) counts as 0, as the trainer's
    # log line of the same figures has it.
    size = lambda name: int(getattr(memory, name, 0) or 0)
    per_device = (size("argument_size_in_bytes")
                  + size("output_size_in_bytes") + size("temp_size_in_bytes")
                  - size("alias_size_in_bytes"))
    # Its arguments (the state, weights) are often made already, and so in
    # what the process maps: counted once, in the program.
    refusal = host_refusal(
        per_device * len(local), what, fix, len(local),
        f" (XLA's memory analysis: {size('temp_size_in_bytes') / 2**30:,.1f}"
        " GiB of temporaries a device)",
        resident=size("argument_size_in_bytes") * len(local))
  refuse_together(refusal, what, fix, {d.process_index for d in devices})


def program_devices(compiled) -> list:
  """The devices a compiled program runs on: its arguments' shardings'
  (those of a host array it was given included)."""
  import jax  # pylint: disable=g-import-not-at-top
  return list(set().union(*(sharding.device_set for sharding in
                            jax.tree.leaves(compiled.input_shardings))))


def compile_checked(lowered, what: str, fix: str):
  """`lowered` compiled, its arrays held first to what any machine holds
  (`check_lowered`: XLA would abort the process) and then, on CPU, its
  memory to this host's (`check_program_host_memory`: it would fail at
  its first call); `fix` says what to lower in both refusals."""
  check_lowered(lowered, what, fix)
  compiled = lowered.compile()
  check_program_host_memory(compiled, program_devices(compiled), what, fix)
  return compiled
