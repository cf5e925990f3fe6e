"""Dream's evaluation log-likelihood: lm-eval's `loglikelihood` requests.

Multiple-choice benchmarks (HellaSwag, ARC, MMLU, PIQA, ...) score each
choice by log p(continuation | context). A masked-diffusion model has no
exact likelihood; Dream's lm-eval harness (dllm's `DreamEvalHarness`,
`_eval_target_nll_mc`) estimates the diffusion bound by Monte Carlo, and
this module computes the same estimate:

- the pair is tokenised as Dream's `_encode_pair` does (trailing spaces of
  the context move to the continuation; the whole text is encoded with the
  end-of-text token appended, and the continuation is what follows the
  context's own encoding);
- each round draws `batch_size` noisy copies: one u ~ U[0, 1), t_b = (u +
  b / batch_size) mod 1 (stratified over the batch), p_b = (1 - eps) t_b +
  eps, and each token is masked with probability p_b, except the first and
  the last position (the appended end-of-text token, so never scored);
  for log_type 'ftb' only the continuation is noised ('btf': only the
  context, 'union': both);
- the prediction for position j is the model's output at j - 1 (Dream's
  logit shift); a round's loss is sum over masked tokens of CE / p_b,
  divided by batch_size; the negative log-likelihood is the mean over the
  mc_num / batch_size rounds ('union' divides the log-likelihood by the
  sequence's length, as the reference).

'ar_ftb' (`nll_type`) is the deterministic variant: the continuation is
revealed left to right, one sequence per token, token i scored with tokens
i and after masked; its sum is exact, and the request is greedy when every
token is the model's argmax there.

The draws are made on the host with a numpy Generator seeded per request
(`seed`), the same for every request: the choices of a question are scored
with common random numbers (the same t and uniforms for equal lengths), and
a request's estimate does not depend on the others. One compiled program
(`score`) per [batch, width, scored positions] shape serves both kinds;
sequences are right-padded to a multiple of `bucket` tokens (the padding is
masked out of attention, so the figures are the unpadded ones up to
floating-point rounding).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from trm.nn import losses

NLL_TYPES = ("mc", "ar_ftb")
LOG_TYPES = ("ftb", "btf", "union")
# The LM head runs on this many scored positions at a time: [batch, CHUNK,
# vocabulary] logits, not [batch, scored, vocabulary] ('union' scores the
# whole sequence).
CHUNK = 128


@dataclasses.dataclass(frozen=True)
class Request:
  """A tokenised request: the context's ids, then the continuation's (the
  end-of-text token last)."""
  prefix: tuple
  target: tuple

  @property
  def tokens(self) -> np.ndarray:
    return np.asarray(self.prefix + self.target, np.int32)


def _is_int(value) -> bool:
  return (isinstance(value, (int, np.integer))
          and not isinstance(value, (bool, np.bool_)))


def check_settings(*, mc_num, batch_size, nll_type, log_type, sampling_eps,
                   seed) -> None:
  """One ValueError (TypeError for a wrong type) naming the argument."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  for name, value in (("mc_num", mc_num), ("batch_size", batch_size)):
    if not _is_int(value) or value < 1:
      raise ValueError(f"{name}={value!r}: must be an integer >= 1.")
  if nll_type not in NLL_TYPES:
    raise ValueError(f"nll_type={nll_type!r}: pass one of "
                     f"{', '.join(NLL_TYPES)}.")
  if log_type not in LOG_TYPES:
    raise ValueError(f"log_type={log_type!r}: pass one of "
                     f"{', '.join(LOG_TYPES)}.")
  if nll_type == "ar_ftb" and log_type != "ftb":
    raise ValueError(f"log_type={log_type!r}: nll_type='ar_ftb' reveals the "
                     "continuation after the context; pass log_type='ftb'.")
  if nll_type == "mc" and mc_num % batch_size:
    raise ValueError(f"mc_num={mc_num} is not a multiple of batch_size="
                     f"{batch_size} (each round draws batch_size samples, as "
                     "Dream's harness asserts); pass a batch_size that "
                     "divides mc_num.")
  if not (isinstance(sampling_eps, (int, float, np.integer, np.floating))
          and not isinstance(sampling_eps, (bool, np.bool_))
          and 0 <= sampling_eps < 1):
    raise ValueError(f"sampling_eps={sampling_eps!r}: must lie in [0, 1).")
  if not _is_int(seed):
    raise inference.ArgumentTypeError(
        f"seed={seed!r} is a {type(seed).__name__}: pass an integer.")
  if seed < 0:
    raise ValueError(f"seed={seed}: must be >= 0.")


def check_requests(requests) -> list[tuple[str, str]]:
  """`requests` (a sequence of (context, continuation) string pairs, as
  lm-eval's `Instance.args`) as a list; one error naming the index
  otherwise."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  if isinstance(requests, (str, bytes, dict)) or not hasattr(requests,
                                                             "__iter__"):
    raise inference.ArgumentTypeError(
        f"requests is a {type(requests).__name__}: pass a list of "
        "(context, continuation) pairs of strings.")
  out = []
  for i, pair in enumerate(requests):
    if (not isinstance(pair, (tuple, list)) or len(pair) != 2
        or not all(isinstance(s, str) for s in pair)):
      raise inference.ArgumentTypeError(
          f"requests[{i}] is {pair!r:.60}: each request is a (context, "
          "continuation) pair of strings.")
    for name, text in zip(("context", "continuation"), pair):
      inference.check_text(text, f"requests[{i}] {name}")
    out.append((pair[0], pair[1]))
  if not out:
    raise ValueError("requests is empty: pass at least one (context, "
                     "continuation) pair.")
  return out


def encode_pair(tokenizer, context: str, continuation: str) -> Request:
  """Dream's `_encode_pair` (without its left cut: a request too long is
  refused by `check_request`)."""
  spaces = len(context) - len(context.rstrip())
  if spaces:
    continuation = context[-spaces:] + continuation
    context = context[:-spaces]
  whole = list(tokenizer.encode(context + continuation)) + [tokenizer.eos_id]
  prefix = list(tokenizer.encode(context))
  return Request(tuple(prefix), tuple(whole[len(prefix):]))


def check_request(request: Request, index: int, mask_id: int,
                  max_positions: Optional[int],
                  log_type: Optional[str] = None,
                  name: Optional[str] = None) -> None:
  """One ValueError naming request `index` (or `name`, e.g. a file's line)
  when it cannot be scored (`log_type`: the Monte Carlo estimate's; None
  for 'ar_ftb')."""
  name = name or f"requests[{index}]"
  if len(request.target) < 2:  # the end-of-text token alone
    raise ValueError(f"{name}: the continuation encodes to no "
                     "token (only the appended end-of-text token, which is "
                     "never scored); pass a non-empty continuation.")
  if log_type == "ftb" and not request.prefix:
    # The estimate never masks position 0 (the BOS's place): with no
    # context the continuation's first token is never scored, and a
    # one-token continuation scored 0.0 (probability 1), the best choice.
    raise ValueError(f"{name}: the context encodes to no token, "
                     "so the continuation's first token would sit at "
                     "position 0, which the estimate never masks nor "
                     "scores; start the context with a token (Dream's "
                     "<|beginoftext|>, as lm-eval puts its prefix token "
                     "before an empty context).")
  if mask_id in request.prefix + request.target:
    raise ValueError(f"{name} holds the mask token (id {mask_id})"
                     ", which the estimate cannot tell from a masked "
                     "position; remove it from the text.")
  length = len(request.prefix) + len(request.target)
  if max_positions is not None and length > max_positions:
    raise ValueError(f"{name}: context and continuation are "
                     f"{length} tokens (with the end-of-text token), more "
                     f"than the model's {max_positions} positions; shorten "
                     "the context.")


def scored_region(prefix_len: int, length: int, log_type: str) -> range:
  """The positions the forward process may noise, before the first and
  last are taken out."""
  if log_type == "ftb":
    return range(prefix_len, length)
  if log_type == "btf":
    return range(0, prefix_len)
  return range(0, length)


def forward_process(rng: np.random.Generator, batch_size: int, length: int,
                    eps: float):
  """(masked [batch_size, length] bool, p_mask [batch_size] float32): Dream's
  `_forward_process` (one uniform for the stratified t of the whole batch,
  then a uniform per token; the first and last positions never masked),
  drawn from `rng`, in float32 as the reference."""
  u0 = rng.random(dtype=np.float32)
  t = (u0 + np.arange(batch_size, dtype=np.float32)
       / np.float32(batch_size)) % np.float32(1)
  p_mask = (np.float32(1 - eps) * t + np.float32(eps)).astype(np.float32)
  masked = rng.random((batch_size, length), dtype=np.float32) < p_mask[:, None]
  masked[:, 0] = False
  masked[:, -1] = False
  return masked, p_mask


# Host bytes of one scored row per position of its padded width: noisy,
# rows, targets (int32), weights (float32) and real (bool), copies made
# while the batch is stacked included.
_ROW_BYTES = 2 * (4 + 4 + 4 + 4 + 1)


def host_memory_refusal(mc_num: int, batch_size: int, nll_type: str,
                        length: int, width: int, index: int) -> str | None:
  """The refusal naming mc_num and batch_size when request `index`'s
  arrays (`length` tokens, rows `width` wide) would not fit in this host's
  memory, else None: its draws' masks (mc_num x length bools, a round's
  float32 uniforms) and its rows. --batch_size=2**31 drew them until the
  kernel's OOM killer ended the process, with no message. The caller
  raises it on every process together (`array_sizes.refuse_together`)."""
  from trm.core import array_sizes  # pylint: disable=g-import-not-at-top
  # 'mc' builds the rows of all mc_num // batch_size rounds before scoring
  # them (`DiffusionLM.mc_draw_losses`), then stacks them: mc_num rows, not
  # one batch's (mc_num=2**24 at batch_size=1 passed, then OOM).
  need = (mc_num if nll_type == "mc" else batch_size) * width * _ROW_BYTES
  if nll_type == "mc":
    need += mc_num * length + batch_size * length * 4
  return array_sizes.host_refusal(
      need, f"{host_memory_names(mc_num, batch_size, nll_type)}: request "
      f"{index} ({length} tokens), for its draws and rows,",
      HOST_MEMORY_FIX[nll_type == "mc"])


# What lowers a request's host memory: ar_ftb's rows are one batch's.
HOST_MEMORY_FIX = ("lower batch_size", "lower mc_num and batch_size")


def host_memory_names(mc_num: int, batch_size: int, nll_type: str) -> str:
  return (f"mc_num={mc_num}, " if nll_type == "mc" else "") + (
      f"batch_size={batch_size}")


def padded(n: int, bucket: int) -> int:
  return -(-n // bucket) * bucket


@dataclasses.dataclass
class Rows:
  """The inputs of one call of `score`: noisy sequences and what to score."""
  noisy: np.ndarray      # [B, W] int32, right-padded with the pad id
  real: np.ndarray       # [B, W] bool: not padding
  rows: np.ndarray       # [B, S] int32: the output row predicting each
  targets: np.ndarray    # [B, S] int32: the clean token there
  weights: np.ndarray    # [B, S] float32 (0: not scored)


def mc_rows(request: Request, masked: np.ndarray, p_mask: np.ndarray,
            log_type: str, mask_id: int, width: int, scored: int,
            pad_id: int) -> Rows:
  """One round's `Rows`: the draws `masked` (over the whole sequence, as
  the reference draws them) kept in the region `log_type` noises."""
  tokens = request.tokens
  batch, length = masked.shape
  region = np.asarray(scored_region(len(request.prefix), length, log_type),
                      np.int64)  # an empty one ("btf" without a context)
  keep = np.zeros(length, bool)
  keep[region] = True
  masked = masked & keep
  noisy = np.full((batch, width), pad_id, np.int32)
  noisy[:, :length] = np.where(masked, mask_id, tokens)
  real = np.zeros((batch, width), bool)
  real[:, :length] = True
  positions = np.zeros(scored, np.int32)
  positions[:len(region)] = region
  weights = np.zeros((batch, scored), np.float32)
  weights[:, :len(region)] = masked[:, region] / p_mask[:, None]
  rows = np.broadcast_to(np.maximum(positions - 1, 0), (batch, scored))
  targets = np.broadcast_to(tokens[positions], (batch, scored))
  return Rows(noisy, real, np.ascontiguousarray(rows, np.int32),
              np.ascontiguousarray(targets, np.int32), weights)


def ar_rows(request: Request, mask_id: int, width: int,
            pad_id: int) -> Rows:
  """Dream's `_eval_target_nll_ar` ('ar_ftb'): row i holds the context and
  the continuation's first i tokens, the rest masked, and scores token i."""
  tokens = request.tokens
  start, count = len(request.prefix), len(request.target)
  length = start + count
  noisy = np.full((count, width), pad_id, np.int32)
  noisy[:, :length] = tokens
  i = np.arange(count)
  hidden = i[:, None] <= i[None, :]  # continuation token j masked in row i
  noisy[:, start:length] = np.where(hidden, mask_id, noisy[:, start:length])
  real = np.zeros((count, width), bool)
  real[:, :length] = True
  position = start + i
  return Rows(noisy, real, np.maximum(position - 1, 0)[:, None].astype(
      np.int32), tokens[position][:, None].astype(np.int32),
              np.ones((count, 1), np.float32))


def stack_rows(parts: Sequence[Rows], batch: int) -> list[Rows]:
  """`parts`' rows in batches of `batch`, the last one filled with copies
  of a row scored with weight 0 (one program for every batch)."""
  whole = Rows(*(np.concatenate([getattr(p, f.name) for p in parts])
                 for f in dataclasses.fields(Rows)))
  count = whole.noisy.shape[0]
  fill = -count % batch
  if fill:
    whole = Rows(*(np.concatenate([x, np.repeat(x[-1:], fill, 0)])
                   for x in dataclasses.astuple(whole)))
    whole.weights[count:] = 0
  return [Rows(*(x[n:n + batch] for x in dataclasses.astuple(whole)))
          for n in range(0, count + fill, batch)]


@functools.partial(jax.jit, static_argnames=("denoiser",))
def score(denoiser, params, noisy, real, rows, targets, weights):
  """(nll [B] float32, wrong [B] int32): per row, sum over the scored slots
  of weight x CE(logits at `rows`, `targets`), and how many scored slots'
  argmax is not their target. The LM head runs on the scored slots only,
  CHUNK at a time."""
  if denoiser.prepare is not None:
    params = denoiser.prepare(params)
  hidden = denoiser.hidden(params, noisy, real, None)
  batch, scored = rows.shape
  size = min(CHUNK, scored)
  pad = -scored % size
  if pad:
    rows, targets, weights = (jnp.pad(x, ((0, 0), (0, pad)))
                              for x in (rows, targets, weights))
  chunks = rows.shape[1] // size

  def split(x):  # [B, chunks * C] -> [chunks, B, C]
    return jnp.moveaxis(x.reshape(batch, chunks, size), 1, 0)

  def chunk(xs):
    r, y, w = xs
    h = jnp.take_along_axis(hidden, r[..., None], axis=1)
    logits = denoiser.head(params, h)
    ce = losses.softmax_cross_entropy(logits, y)
    wrong = (w > 0) & (jnp.argmax(logits, -1) != y)
    return (jnp.sum(w * ce, -1),
            jnp.sum(wrong, -1, dtype=jnp.int32))

  nll, wrong = jax.lax.map(chunk, (split(rows), split(targets),
                                   split(weights)))
  return nll.sum(0), wrong.sum(0)


# ------------------------------------------------------------ files (CLI)

# What a requests line holds (trm.evaluate --loglikelihood): lm-eval's
# loglikelihood request, `Instance.args`.
REQUEST_FIELDS = ("context", "continuation")


def read_requests(path: str, flag: str = "--loglikelihood"
                  ) -> list[tuple[str, str]]:
  """The (context, continuation) pairs of a JSONL file, one object per line
  with string fields "context" and "continuation" (other fields are
  ignored; blank lines are skipped). One error naming the file and line."""
  return [pair for _, pair in read_numbered_requests(path, flag)]


def read_numbered_requests(path: str, flag: str = "--loglikelihood"
                           ) -> list[tuple[int, tuple[str, str]]]:
  """`read_requests`' pairs with the file line of each (blank lines are
  skipped, so a pair's index is not its line); each text UTF-8."""
  from trm.data import io as data_io  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  shape = ('one JSON object per line: {"context": "...", "continuation": '
           '"..."}')
  if not os.path.exists(path):
    raise FileNotFoundError(f"{flag}={path}: no such file ({shape}).")
  text = data_io.read_utf8(path, fix=f"{flag} holds {shape}")
  pairs = []
  for number, line in enumerate(data_io.split_lines(text), 1):
    if not line.strip():
      continue
    try:
      record = data_io.json_record(line)
    except data_io.RepeatedKey as e:  # json would keep the last value
      raise ValueError(f"{flag}={path} line {number}: {e}.") from None
    except (ValueError, RecursionError) as e:  # nesting, 4300+ digit ints
      raise ValueError(f"{flag}={path} line {number}: not JSON ({e}); it "
                       f"holds {shape}.") from None
    if not (isinstance(record, dict) and all(
        isinstance(record.get(k), str) for k in REQUEST_FIELDS)):
      raise ValueError(f"{flag}={path} line {number}: {line.strip()!r:.60} "
                       f"is not a request; the file holds {shape} (strings)."
                       )
    for name in REQUEST_FIELDS:  # a "\ud800" escape: a lone surrogate
      inference.check_text(record[name], f"{flag}={path} line {number} "
                           f"{name}")
    pairs.append((number, (record["context"], record["continuation"])))
  if not pairs:
    raise ValueError(f"{flag}={path} holds no requests ({shape}).")
  return pairs


def check_file_requests(numbered, tokenizer, mask_id: int,
                        max_positions: Optional[int], nll_type: str,
                        log_type: str, where: str) -> None:
  """`check_request` for each of `read_numbered_requests`' pairs, the
  error naming its file line (`where`: "--loglikelihood=<path>"): run with
  the tokenizer before any weight is read."""
  for number, pair in numbered:
    check_request(encode_pair(tokenizer, *pair), number - 1, mask_id,
                  max_positions, log_type if nll_type == "mc" else None,
                  name=f"{where} line {number}")


def requests_digest(pairs) -> str:
  """sha256 of the (context, continuation) pairs: what a resumed run checks
  the requests file against (its path may hold other requests by now)."""
  import hashlib  # pylint: disable=g-import-not-at-top
  return hashlib.sha256(json.dumps(list(pairs)).encode("utf-8")).hexdigest()


def result_line(ll, greedy) -> str:
  """One request's line: {"loglikelihood": float (null if not finite),
  "is_greedy": bool}."""
  from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
  return json.dumps(atomic_files.nonfinite_as_null(dict(
      loglikelihood=float(ll), is_greedy=bool(greedy))),
                    allow_nan=False) + "\n"


def write_results(path: str, results, settings: dict) -> None:
  """One JSON line per request, in order: {"loglikelihood": float (null if
  not finite), "is_greedy": bool}, and the settings beside it
  (<stem>_settings.json); each file whole or not at all."""
  from trm.data import atomic_files  # pylint: disable=g-import-not-at-top

  def lines(f):
    for ll, greedy in results:
      f.write(result_line(ll, greedy))

  atomic_files.atomic_write(path, lines, mode="w")
  write_settings(path, settings)


def write_settings(path: str, settings: dict) -> None:
  """The settings of the results file `path`, beside it, whole or not at
  all."""
  from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
  atomic_files.atomic_write(
      settings_path(path), lambda f: json.dump(settings, f, indent=1),
      mode="w")


def append_results(path: str, results) -> None:
  """Appends results' lines to `path` and flushes them to disk: a killed
  run keeps every request scored so far (--resume goes on from them)."""
  with open(path, "a", encoding="utf-8") as f:
    for ll, greedy in results:
      f.write(result_line(ll, greedy))
    f.flush()
    os.fsync(f.fileno())


def resumed_lines(path: str, count: int) -> list[str]:
  """--resume: the whole result lines of `path` (a line cut by a kill
  dropped), one line naming the first that is not a result; `count`: the
  requests."""
  with open(path, "rb") as f:
    data = f.read()
  lines = data.split(b"\n")
  lines.pop()  # after the last newline: b"" or a line cut by a kill
  kept = []
  for number, raw in enumerate(lines, 1):
    try:
      record = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
      record = None
    if not (isinstance(record, dict) and set(record) == {
        "loglikelihood", "is_greedy"}
            and isinstance(record["is_greedy"], bool)
            and (record["loglikelihood"] is None or isinstance(
                record["loglikelihood"], float))):
      raise ValueError(f"--resume: {path} line {number} is not a result "
                       "line written by trm.evaluate --loglikelihood: rerun "
                       "without --resume to start again.")
    kept.append(raw.decode("utf-8") + "\n")
  if len(kept) > count:
    raise ValueError(f"--resume: {path} holds {len(kept)} results, more "
                     f"than the {count} requests: rerun without --resume "
                     "to start again.")
  return kept


def start_results(path: str, settings: dict, kept: Sequence[str],
                  replace: bool = False) -> None:
  """Starts the results file `path` with the `kept` lines (whole or not at
  all) and records `settings` beside it (`complete` False until the last
  request is written). `replace`: the lines are this run's and `path` holds
  another run's, whose settings are removed first."""
  from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
  if replace:
    # Killed between the results and the settings, the earlier run's
    # settings would describe this run's lines (a --resume with them kept
    # the lines); without settings --resume refuses.
    atomic_files.remove_before_rewrite(settings_path(path))
  # The results first: killed between the two writes, the file holds no
  # line of an earlier run under this run's settings (--resume would keep
  # them).
  atomic_files.atomic_write(path, lambda f: f.writelines(kept), mode="w")
  write_settings(path, dict(settings, complete=False))


def settings_path(output: str) -> str:
  """Where `write_results` records the settings of `output`."""
  return os.path.splitext(output)[0] + "_settings.json"
