"""What the parity scripts share: check records, the comparison, one line
per check, the summary, `--json` and the exit codes.

A script (upstream_*.py in this folder) puts its own folder on sys.path and
imports this module as `common` (the folder is sys.path[0] when it runs as
a script; tests load the scripts by path):

  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import common

  def main(argv=None) -> int:
    try:
      args = parse_args(argv)           # raises common.UsageError
    except common.UsageError as e:
      return common.refuse("upstream_x.py", e)   # one stderr line, 2
    report = common.Report()
    report.add(common.compare("logits", ours, theirs, 1e-5))
    report.add(common.compare_trees("grads", our_tree, their_tree, 1e-4))
    report.add(common.compare_exact("tokens", [(our_ids, their_ids)]))
    report.skip("optimizer", "no --adam_atan2_dir")
    return report.finish(args.json, upstream_commit=commit)  # 0, or 1

The pieces:

  Check            one check's record: name, passed, max_abs / max_rel (None
                   for exact or custom checks), tol (a number, or "exact"),
                   figures (the line's figures column), note, info (printed,
                   not scored), skipped (why), values (anything else, kept in
                   the JSON). `Check(name, passed, figures=..., note=...)`
                   makes a custom one; `add_note` appends to the note.
  compare          max_abs = max |ours - theirs|; max_rel = max_abs over
                   max |scale| (scale: theirs by default, "larger" for the
                   larger side's max |value|, or an array); passes when the
                   shapes agree, every value is finite and max_rel <= tol.
                   `where` (a boolean array) keeps those elements only.
  compare_all      `compare` over (label, ours, theirs[, scale]) items, each
                   against its own scale: max_abs over all, the worst item's
                   max_rel, note "worst: LABEL"; passes when every item does.
  compare_trees    `compare_all` over the leaves of two nested dicts (labels
                   "a/b/c"); different leaf sets FAIL.
  compare_exact    (ours, theirs) pairs compared element by element: "N of M
                   differ" (a pair of different shapes: all of it differs).
  draw_test        our draws [R, N] against upstream's probabilities [R, V]:
                   a chi-square test per row (Bonferroni over the run's
                   rows); a draw where upstream's probability is 0, or a
                   likely token never drawn, fails.
  Report           prints each check's line as it is added, `skip`s,
                   `finish` prints "N of M checks passed" (INFO and SKIP
                   lines not counted; the failed names after), writes
                   --json ({header..., "checks": [...]}) and returns the
                   exit code: 1 if a check failed, else 0.
  read_flags       `--name=value` flags into a dataclass of options, typed
                   by its fields' defaults.
  comma_list       a comma-list flag's names, each checked against the
                   choices (read_flags' tuple fields; the argparse scripts'
                   --checks, --cases, --variants, --dtypes).
  UsageError, refuse, require_files, require_json_dir
                   a bad flag: one line on stderr naming the flag, exit 2.

One line per check, the same for every script:

  NAME (56 wide) FIGURES (36 wide) tol TOL STATUS  (NOTE)

e.g. (upstream_nanogpt.py)
  v65_bias grads (every parameter)                         max_abs 2.533e-07 max_rel 2.057e-06  tol 1e-04     PASS  (worst: wpe/embedding)
  v65_bias sample top_k=1 tokens                           0 of 170 differ                      tol exact     PASS

STATUS is PASS, FAIL, INFO (reported, not scored) or SKIP.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any

import numpy as np

class UsageError(Exception):
  """A bad flag: one line naming the flag, exit status 2."""


def refuse(script: str, error) -> int:
  """Prints `script: error` (one line) on stderr; returns 2."""
  print(f"{script}: {error}", file=sys.stderr)
  return 2


def read_flags(argv, options, choices=()):
  """`--name=value` flags into the dataclass `options`, each converted to
  its field's default type (str, int, float; a bool field is a bare
  `--name`; a tuple field is a comma list drawn from `choices`). Raises
  UsageError naming the flag; returns `options`."""
  for arg in argv:
    if not arg.startswith("--"):
      raise UsageError(f"unexpected argument {arg!r} (flags are --name=value)")
    name, eq, value = arg[2:].partition("=")
    kind = type(getattr(options, name, None))
    if kind is bool and not eq:
      setattr(options, name, True)
      continue
    if not eq:
      raise UsageError(f"--{name} needs a value (--{name}=...)")
    if kind is str:
      setattr(options, name, value)
    elif kind is tuple:
      setattr(options, name, comma_list(name, value, choices))
    elif kind in (int, float):
      try:
        setattr(options, name, kind(value))
      except ValueError:
        raise UsageError(f"--{name}={value!r} is not a number") from None
    else:
      raise UsageError(f"unknown flag --{name}")
  return options


def comma_list(flag: str, value: str, choices) -> tuple[str, ...]:
  """The names a comma-list flag `--flag=a,b` gives, in order (empty items
  skipped, so a stray comma is harmless). UsageError naming the flag unless
  it gives at least one and every one is among `choices`: a misspelt name
  would otherwise select no work and report nothing."""
  picked = tuple(c for c in value.split(",") if c)
  if not picked or any(c not in choices for c in picked):
    raise UsageError(f"--{flag}={value}: use a comma-separated subset of "
                     f"{','.join(choices)}")
  return picked


def require_files(flag: str, path: str, files, what: str) -> None:
  """UsageError unless --flag=path is a directory holding `files` (paths
  relative to it); `what` names the work tree (e.g. "a nanoGPT")."""
  if not os.path.isdir(path):
    raise UsageError(f"--{flag}={path} is not a directory")
  missing = [f for f in files if not os.path.isfile(os.path.join(path, f))]
  if missing:
    raise UsageError(f"--{flag}={path} is not {what} work tree: it lacks "
                     f"{', '.join(missing)}")


def require_json_dir(path: str | None) -> None:
  """UsageError unless --json=path (if given) can be written: said before
  the minutes of checks, not after them."""
  if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
    raise UsageError(f"--json={path}: directory "
                     f"{os.path.dirname(os.path.abspath(path))} does not "
                     "exist")


# ------------------------------------------------------------- records


def _tol_text(tol) -> str:
  """1e-05 as such; 1.4e-05 (a computed tolerance) with its digit."""
  if isinstance(tol, str):
    return tol
  text = f"{tol:.0e}"
  return text if float(text) == tol else f"{tol:.1e}"


@dataclasses.dataclass
class Check:
  """One check. `figures` defaults to max_abs / max_rel when those are
  given; `tol` is a number (relative) or a word ("exact")."""
  name: str
  passed: bool
  max_abs: float | None = None
  max_rel: float | None = None
  tol: Any = "exact"
  figures: str = ""
  note: str = ""
  info: bool = False
  skipped: str = ""
  values: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if not self.figures and self.max_rel is not None:
      self.figures = (f"max_abs {self.max_abs:.3e} max_rel "
                      f"{self.max_rel:.3e}")

  def add_note(self, text: str) -> None:
    """Appends `text` to the note ("; " between)."""
    self.note = "; ".join(filter(None, [self.note, text]))

  @property
  def status(self) -> str:
    if self.skipped:
      return "SKIP"
    if self.info:
      return "INFO"
    return "PASS" if self.passed else "FAIL"

  @property
  def scored(self) -> bool:
    return not (self.info or self.skipped)

  def line(self) -> str:
    if self.skipped:
      return f"{self.name:<56} {'':<36} {'':<13} SKIP  ({self.skipped})"
    note = f"  ({self.note})" if self.note else ""
    return (f"{self.name:<56} {self.figures:<36} tol "
            f"{_tol_text(self.tol):<9} {self.status}{note}")

  def to_json(self) -> dict:
    row = {"name": self.name, "status": self.status, "pass": self.passed,
           "max_abs": self.max_abs, "max_rel": self.max_rel,
           "tol": self.tol, "figures": self.figures, "note": self.note}
    if self.skipped:
      row["skipped"] = self.skipped
    if self.values:
      row["values"] = self.values
    return row


# ----------------------------------------------------------- comparing


def compare(name: str, ours, theirs, tol: float, *, scale=None, where=None,
            note: str = "") -> Check:
  """One float check (see the module docstring). NaN or inf fails."""
  a = np.asarray(ours, np.float64)
  b = np.asarray(theirs, np.float64)
  if a.shape != b.shape:
    return Check(name, False, math.inf, math.inf, tol,
                 note=f"shapes differ: ours {a.shape}, upstream {b.shape}"
                 + (f"; {note}" if note else ""))
  if isinstance(scale, str):
    if scale != "larger":
      raise ValueError(f"scale={scale!r}: use 'larger' or an array")
    s = None
  else:
    s = b if scale is None else np.asarray(scale, np.float64)
  if where is not None:
    keep = np.asarray(where)
    a, b = a[keep], b[keep]
    if s is not None and s.shape == keep.shape:
      s = s[keep]
  if s is None:  # "larger"
    s = np.concatenate([np.abs(a).ravel(), np.abs(b).ravel()])
  finite = bool(np.isfinite(a).all() and np.isfinite(b).all())
  max_abs = float(np.abs(a - b).max()) if a.size else 0.0
  denom = float(np.abs(s).max()) if s.size else 0.0
  max_rel = (max_abs / denom if denom > 0
             else (0.0 if max_abs == 0 else math.inf))
  if not finite:
    note = "non-finite values" + (f"; {note}" if note else "")
  return Check(name, finite and max_rel <= tol, max_abs, max_rel, tol,
               note=note)


def compare_all(name: str, items, tol: float, note: str = "") -> Check:
  """`compare` over (label, ours, theirs[, scale]) items (see the module
  docstring); the worst item is the failing one, else the largest
  max_rel."""
  max_abs, worst, all_pass, notes = 0.0, None, True, []
  for item in items:
    label, ours, theirs = item[:3]
    c = compare(label, ours, theirs, tol,
                scale=item[3] if len(item) > 3 else None)
    all_pass = all_pass and c.passed
    if c.note:
      notes.append(f"{label}: {c.note}" if label else c.note)
    if not math.isnan(c.max_abs):
      max_abs = max(max_abs, c.max_abs)
    key = (not c.passed, c.max_rel if not math.isnan(c.max_rel) else math.inf)
    if worst is None or key > worst[0]:
      worst = (key, c)
  if worst is None:
    return Check(name, True, 0.0, 0.0, tol, note=note)
  c = worst[1]
  said = ([f"worst: {c.name}"] if c.name else []) + notes + (
      [note] if note else [])
  return Check(name, all_pass, max_abs, c.max_rel, tol, note="; ".join(said))


def leaves(tree, prefix=()):
  """(path tuple, leaf) of a nested dict, in sorted key order."""
  for k in sorted(tree):
    v = tree[k]
    if isinstance(v, dict):
      yield from leaves(v, prefix + (k,))
    else:
      yield prefix + (k,), v


def _get(tree, path):
  for k in path:
    tree = tree[k]
  return tree


def compare_trees(name: str, ours: dict, theirs: dict, tol: float,
                  scale: dict | None = None, note: str = "") -> Check:
  """`compare_all` over the leaves of two nested dicts ("a/b" labels);
  a scale tree, when given, has the same leaves."""
  mine = dict(leaves(ours))
  paths = [p for p, _ in leaves(theirs)]
  if set(mine) != set(paths):
    only = sorted(set(mine) ^ set(paths))
    return Check(name, False, math.inf, math.inf, tol,
                 note="parameter trees differ: "
                 + ", ".join("/".join(p) for p in only[:4])
                 + (" ..." if len(only) > 4 else ""))
  items = [("/".join(p), mine[p], _get(theirs, p))
           + (() if scale is None else (_get(scale, p),)) for p in paths]
  return compare_all(name, items, tol, note)


def compare_exact(name: str, pairs, note: str = "") -> Check:
  """Element-by-element equality over (ours, theirs) pairs: "N of M
  differ", tolerance exact."""
  bad = total = 0
  shapes = []
  for ours, theirs in pairs:
    a, b = np.asarray(ours), np.asarray(theirs)
    total += b.size
    if a.shape != b.shape:
      bad += b.size
      shapes.append(f"shapes differ: ours {a.shape}, upstream {b.shape}")
    else:
      bad += int((a != b).sum())
  note = "; ".join(shapes + ([note] if note else []))
  return Check(name, bad == 0, tol="exact",
               figures=f"{bad} of {total} differ", note=note,
               values={"differ": bad, "total": total})


# ------------------------------------------------------------- report


class Report:
  """The checks of one run: each printed as added; `finish` ends it."""

  def __init__(self, out=None):
    self.checks: list[Check] = []
    self.out = out

  def add(self, check: Check) -> bool:
    self.checks.append(check)
    print(check.line(), file=self.out or sys.stdout, flush=True)
    return check.passed

  def extend(self, checks) -> None:
    for c in checks:
      self.add(c)

  def skip(self, name: str, why: str) -> None:
    self.add(Check(name, True, skipped=why))

  @property
  def failed(self) -> list[Check]:
    return [c for c in self.checks if c.scored and not c.passed]

  def summary(self) -> str:
    scored = [c for c in self.checks if c.scored]
    failed = self.failed
    aside = len(self.checks) - len(scored)
    return (f"{len(scored) - len(failed)} of {len(scored)} checks passed"
            + (f" ({aside} INFO/SKIP lines not counted)" if aside else "")
            + (f"; FAILED: {', '.join(c.name for c in failed)}"
               if failed else ""))

  def finish(self, json_path: str | None = None, **header) -> int:
    """Prints the summary, writes --json (`header`'s keys, then "checks")
    and returns the exit code: 1 if a check failed, else 0."""
    print(self.summary(), file=self.out or sys.stdout, flush=True)
    if json_path:
      with open(json_path, "w") as f:
        json.dump({**header, "checks": [c.to_json() for c in self.checks]},
                  f, indent=1, default=str)
    return 1 if self.failed else 0


# ------------------------------------------------------- draws vs probs


def draw_test(name: str, draws, probs, *, alpha: float = 1e-6,
              tests: int = 1, note: str = "") -> Check:
  """Our sampler's draws against upstream's distributions: one Pearson
  chi-square test per row of `probs` ([R, V], upstream's probabilities
  after its filters) on `draws` ([R, N] token ids, N draws per row), bins
  of expected count < 5 pooled into one. A row fails when its p-value is
  below alpha / tests (Bonferroni over `tests` rows in the whole run),
  when any draw lands where upstream's probability is 0, or
  when a token upstream keeps is never drawn although the chance of that,
  (1 - p)^N, is below alpha / tests / V (a dropped token is caught once its
  expected count exceeds ln(tests * V / alpha), about 25 draws here; the
  chi-square catches smaller shifts spread over many tokens). A correct
  sampler fails anywhere in the run with probability <= 2 alpha (the
  chi-square's asymptotic tail; bins of expected count < 5 pooled).
  Figures: the smallest p-value, draws outside, likely tokens never drawn;
  the largest total-variation distance is kept in `values`."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  probs = np.asarray(probs, np.float64)
  draws = np.asarray(draws)
  level = alpha / max(1, tests)
  min_p, max_tv, outside, bad_rows, failed = 1.0, 0.0, 0, 0, []
  missing = 0
  for row, (p, d) in enumerate(zip(probs, draws)):
    p = p / p.sum()
    n = d.size
    counts = np.bincount(d.ravel(), minlength=p.size).astype(np.float64)
    out = int(counts[p <= 0].sum())
    # Coverage: a kept token never drawn although P(0 of n) < level / V.
    never = (counts == 0) & (p > 0)
    p_zero = np.exp(n * np.log1p(-np.minimum(p, 1 - 1e-16)))
    gone = int((never & (p_zero < level / p.size)).sum())
    missing += gone
    expected = n * p
    big = expected >= 5
    obs = list(counts[big])
    exp = list(expected[big])
    rest = (p > 0) & ~big
    if rest.any():
      obs.append(counts[rest].sum())
      exp.append(expected[rest].sum())
    obs, exp = np.array(obs), np.array(exp)
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    pval = float(stats.chi2.sf(chi2, max(1, obs.size - 1))) if (
        obs.size > 1) else 1.0
    tv = 0.5 * float(np.abs(counts / n - p).sum())
    min_p, max_tv = min(min_p, pval), max(max_tv, tv)
    outside += out
    if out > 0 or gone > 0 or pval < level:
      bad_rows += 1
      failed.append(row)
  passed = bad_rows == 0
  said = (f"{draws.shape[0]} rows x {draws[0].size} draws; false alarm "
          f"<= {2 * alpha:.0e} over {tests} rows"
          + (f"; {bad_rows} rows fail" if bad_rows else ""))
  return Check(name, passed, tol=f"p>={level:.0e}",
               figures=f"min p {min_p:.1e} out {outside} unseen {missing}",
               note="; ".join(filter(None, [said, note])),
               values={"min_p": min_p, "max_tv": max_tv,
                       "outside": outside, "missing": missing,
                       "bad_rows": bad_rows,
                       "failed_rows": failed})
