r"""Our nanoGPT against karpathy/nanoGPT's own code, run from a checkout.

  PYTHONPATH=. python benchmarks/parity/upstream_nanogpt.py \
      --upstream_dir=/path/to/nanoGPT \
      --input=../shared/data/tinyshakespeare/input.txt [--json=out.json]

`--upstream_dir` is a nanoGPT work tree (model.py, train.py,
data/shakespeare_char/prepare.py); its modules are imported at run time
(nothing of it is copied here) and its commit is printed when the directory
is a git work tree. Everything runs on the CPU in float32 with dropout 0
(the `dropout` and `bf16` checks aside), on small models (2 layers, 4 heads, n_embd 64, block_size 64): vocabulary 65
with and without biases, and a 50304-entry vocabulary (GPT-2's padded
figure) without biases.

Per model configuration:

  model   upstream GPT(GPTConfig) saved as train.py saves ckpt.pt (model,
          optimizer, model_args, iter_num, best_val_loss, config), also as a
          torch.compile'd model's `_orig_mod.` keys, read by our
          gpt_import: logits and loss with targets (some -1, ignored), and
          the targets=None path's last-position logits on a shorter input.
  grads   the gradient of every parameter (the tied wte/lm_head as one).
  optim   upstream configure_optimizers (AdamW, decay on >= 2-D tensors;
          its fused kernel too, asked for with device_type='cuda', which
          torch also runs on CPU tensors) + train.py's get_lr (taken out of
          train.py with `ast` and executed, not copied) + clip_grad_norm_
          (1.0) + gradient accumulation (3 micro-batches, loss / 3), against
          our train_step: parameters after 4 iterations from iteration 0
          (warmup into the cosine) and after 4 from iteration 5 (a fresh
          optimizer at iteration 5, through lr_decay_iters into min_lr);
          then `resume`: upstream's ckpt.pt after those first 4 iterations,
          its AdamW state included, loaded as trm.main's init_from=resume
          does, and both continue 3 iterations. Upstream also runs in
          float64 (the truth): each comparison prints ours against upstream
          float32 and ours against float64, with tolerances of 5x and 4x
          upstream's own float32-vs-float64 error F (at least 1e-2), since
          AdamW's first steps move an element by about lr * sign(g) however
          small g is, so rounding noise in near-zero gradients becomes a
          whole update. The key third of c_attn's bias, whose exact gradient
          is zero, is left out of these (the grads check covers it).
  schedule  our learning-rate schedule against train.py's get_lr at
          every iteration around the warmup's end and lr_decay_iters and
          200 in between, for configs/gpt.py (GPT-2), :shakespeare_char and
          the optim check's schedule (relative 1e-6).
  sample  upstream model.generate(top_k=1) against our gpt.generate
          (top_k=1, and temperature 0), past block_size (the crop window).
  port    benchmarks/reference/nanogpt_torch.py (our spec-written port,
          the GPU and CPU speed comparisons' nanoGPT) against model.py: the
          initial weights from one seed, logits, loss, gradients and 4
          AdamW iterations.

Once: `data`, upstream's data/shakespeare_char/prepare.py run on a copy of
--input in a temporary directory, against our preparation
(trm.data.text.windows.ensure_prepared): train.bin and val.bin bytes and
the vocabulary; again on the input's first 100000 characters with CRLF line
ends and a lone CR (prepare.py reads in text mode, so those are LF to it).

One line per check in common.py's format: max abs diff / max rel diff (the
max abs diff over the largest magnitude of upstream's values: of the tensor,
of the change made by the iterations for parameters; "N of M differ" for
tokens and bytes), the tolerance on the relative figure, PASS or FAIL, the
worst tensor. Exits 1 when a check fails, 2 on a bad flag. `--perturb=EPS` adds EPS to our copy of ln_f's scale after
every load, so the comparisons must fail (a self-test). `--checks` picks a
subset (model,grads,optim,sample,port,data,schedule,draws,dropout,bf16).

  dropout, bf16  per model configuration: dropout at train_shakespeare_char's
          0.2 with our masks carried into upstream's model, and
          torch.autocast(bfloat16) against our model.dtype='bfloat16'
          (nanogpt_numerics.py says how).

  draws   sampling at temperature > 0 by distribution (torch's and JAX's
          RNGs differ, so tokens cannot match). Once, on random logits
          (vocab 300; rows of integer logits and a row of 30 equal top
          logits, so ties at the k-th keep more than k) for temperature
          0.5/1.0/1.3 x top_k None/1/20/50: upstream's own GPT.generate
          runs one step on a stand-in model that returns those logits, with
          torch.multinomial replaced by a recorder that returns OUR token:
          its kept set (probability > 0) and probabilities against our
          gpt.model.sampling_probs (the pieces our draw uses), the tokens
          our _sample drew inside upstream's support, and 2,000 draws per
          row of our _sample against upstream's probabilities
          (common.draw_test: chi-square per row, false alarm <= 1e-6 over
          the run). Per model configuration: our gpt.generate at
          temperature 0.8 and 1.2 with top_k 20 past block_size, upstream's
          generate teacher-forced on our tokens (the recorder returns them):
          every token we drew has upstream probability > 0, and the
          per-step probabilities from our model (forward on each step's
          cropped context) against those upstream drew from.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib
import io
import math
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import zlib

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (_REPO, _HERE):  # trm, and common.py beside this file
  if _path not in sys.path:
    sys.path.insert(0, _path)
import common  # pylint: disable=g-import-not-at-top,wrong-import-position
import nanogpt_numerics as numerics  # pylint: disable=g-import-not-at-top,wrong-import-position
from common import Check, UsageError, compare, compare_trees  # pylint: disable=g-import-not-at-top,wrong-import-position

CHECKS = ("model", "grads", "optim", "sample", "port", "data", "schedule",
          "draws", "dropout", "bf16")
UPSTREAM_FILES = ("model.py", "train.py",
                  os.path.join("data", "shakespeare_char", "prepare.py"))
DEFAULT_INPUT = os.path.join(_REPO, "..", "shared", "data", "tinyshakespeare",
                             "input.txt")
# Tolerances on the relative figure (float32 on one CPU).
TOL_FORWARD = 2e-5
TOL_GRAD = 1e-4
TOL_PARAMS = 1e-2  # of the change the iterations made
SIZES = dict(n_layer=2, n_head=4, n_embd=64, block_size=64, dropout=0.0)
CASES = (  # (label, vocab_size, bias)
    ("v65_bias", 65, True),
    ("v65_nobias", 65, False),
    ("v50304_nobias", 50304, False),
)
# Schedule and optimizer of the `optim` check (train.py's names).
OPTIM = dict(learning_rate=6e-3, min_lr=6e-4, warmup_iters=2,
             lr_decay_iters=6, weight_decay=0.1, beta1=0.9, beta2=0.95,
             grad_clip=1.0)
ACCUM, MICRO_BATCH, STEPS = 3, 4, 4
WEIGHT_NOISE = 0.25
# The draws check: random logits, draws per row, the run's false-alarm
# bound, tolerances on probabilities (relative to the row's largest): from
# the same logits (float32 rounding), from each model's own logits.
DRAW_VOCAB, DRAW_N, DRAW_ALPHA = 300, 2000, 1e-6
TOL_PROBS, TOL_STEP_PROBS = 1e-6, 1e-4
DRAW_SETTINGS = tuple((t, k) for t in (0.5, 1.0, 1.3)
                      for k in (None, 1, 20, 50))


# ------------------------------------------------------------- flags


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--upstream_dir", default=None,
                 help="karpathy/nanoGPT work tree (model.py, train.py, ...)")
  p.add_argument("--input", default=DEFAULT_INPUT,
                 help="tinyshakespeare input.txt for the data check")
  p.add_argument("--checks", default=",".join(CHECKS),
                 help=f"comma-separated subset of {','.join(CHECKS)}")
  p.add_argument("--cases", default=",".join(c[0] for c in CASES),
                 help="model configurations: "
                 + ",".join(c[0] for c in CASES))
  p.add_argument("--perturb", type=float, default=0.0,
                 help="add this to our ln_f scale after loading (self-test)")
  p.add_argument("--json", default=None, help="also write results here")
  p.add_argument("--threads", type=int, default=2, help="torch threads")
  return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
  """Raises UsageError (one line naming the flag) before any work; turns
  --checks and --cases into tuples of names."""
  if not args.upstream_dir:
    raise UsageError("--upstream_dir is required: a karpathy/nanoGPT work "
                     "tree (e.g. `git worktree add DIR` of its repository).")
  common.require_files("upstream_dir", os.path.expanduser(args.upstream_dir),
                       UPSTREAM_FILES, "a nanoGPT")
  # From here on the two are tuples of names.
  args.checks = common.comma_list("checks", args.checks, CHECKS)
  args.cases = common.comma_list("cases", args.cases, [c[0] for c in CASES])
  if "data" in args.checks and not os.path.isfile(args.input):
    raise UsageError(f"--input={args.input}: no such file (tinyshakespeare's "
                     "input.txt, for the data check).")
  common.require_json_dir(args.json)
  if not math.isfinite(args.perturb):
    raise UsageError(f"--perturb={args.perturb} must be finite.")


def upstream_commit(d: str) -> str:
  try:
    out = subprocess.run(["git", "-C", d, "rev-parse", "HEAD"],
                         capture_output=True, text=True, timeout=30,
                         check=False)
  except (OSError, subprocess.SubprocessError):
    return "unknown (git unavailable)"
  return out.stdout.strip() if out.returncode == 0 else (
      "unknown (not a git work tree)")


# ------------------------------------------------------------- upstream


def import_upstream_model(d: str):
  """Upstream's model.py as a module (its prints silenced)."""
  d = os.path.abspath(os.path.expanduser(d))
  if d not in sys.path:
    sys.path.insert(0, d)
  sys.modules.pop("model", None)
  with contextlib.redirect_stdout(io.StringIO()):
    return importlib.import_module("model")


def upstream_get_lr(d: str, **globals_):
  """train.py's get_lr, its source taken out of train.py with ast and
  executed with the schedule's globals (learning_rate, warmup_iters,
  lr_decay_iters, min_lr)."""
  path = os.path.join(d, "train.py")
  with open(path, encoding="utf-8") as f:
    source = f.read()
  for node in ast.parse(source).body:
    if isinstance(node, ast.FunctionDef) and node.name == "get_lr":
      namespace = {"math": math, **globals_}
      exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"),
           namespace)  # pylint: disable=exec-used
      return namespace["get_lr"]
  raise RuntimeError(f"{path} defines no get_lr")


def quiet(fn, *a, **k):
  with contextlib.redirect_stdout(io.StringIO()):
    return fn(*a, **k)


# ------------------------------------------------------------- ours


def _ours(params, perturb: float):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  params = jax.tree.map(jnp.asarray, params)
  if perturb:
    params = dict(params)
    params["ln_f"] = dict(params["ln_f"],
                          scale=params["ln_f"]["scale"] + perturb)
  return params


def _torch_grads_in_our_layout(named_grads: dict, args: dict):
  """Upstream's gradients (named_parameters order, the tied tensor once as
  transformer.wte.weight) in our tree, through our own layout table."""
  from trm.families.gpt import gpt_layout  # pylint: disable=g-import-not-at-top
  tensors = {k[len("transformer."):]: v for k, v in named_grads.items()
             if k.startswith("transformer.")}
  return gpt_layout.convert(tensors, args, "upstream gradients",
                            "transformer.", torch_linear=True)


def _without_key_bias(tree):
  """`tree` with the key third of every c_attn bias set to 0. Its exact
  gradient is zero (adding a constant vector to every key adds q.b to all of
  a query's scores, which softmax ignores), so in float32 it is rounding
  noise, and AdamW moves it by about lr * sign(noise): upstream in float32
  and in float64 disagree there by the whole update. Left out of the
  `optim` comparisons (the gradient check compares it)."""
  import jax  # pylint: disable=g-import-not-at-top
  tree = jax.tree.map(lambda a: np.array(a, np.float64), tree)
  for name, block in tree.items():
    bias = block.get("attn", {}).get("c_attn", {}).get("bias") if (
        name.startswith("h_")) else None
    if bias is not None:
      c = bias.shape[0] // 3
      bias[c:2 * c] = 0.0
  return tree


def _config(vocab_size: int, bias: bool, **optim):
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  c = config_lib.load_config(os.path.join(_REPO, "configs", "gpt.py"),
                             "shakespeare_char_cpu")
  c = config_lib.set_values(c, dict(
      n_layer=SIZES["n_layer"], n_head=SIZES["n_head"],
      n_embd=SIZES["n_embd"], block_size=SIZES["block_size"], dropout=0.0,
      bias=bias, dtype="float32", batch_size=MICRO_BATCH,
      gradient_accumulation_steps=ACCUM, **optim))
  with c.unlocked():
    c.model.vocab_size = vocab_size
    c.seed = 0
  return c


# ------------------------------------------------------------- checks


def _batches(rng, n, vocab_real, t):
  """n (x, y) pairs [MICRO_BATCH, t] int64 from a random token stream."""
  out = []
  for _ in range(n):
    stream = rng.integers(0, vocab_real, size=(MICRO_BATCH, t + 1))
    out.append((np.ascontiguousarray(stream[:, :-1]),
                np.ascontiguousarray(stream[:, 1:])))
  return out


class _Multinomial:
  """Replaces torch.multinomial while active: records each probs tensor
  upstream's generate draws from and returns the next of `tokens` (ours,
  one [B] array per call) as its [B, 1] draw."""

  def __init__(self, tokens):
    self.tokens = list(tokens)
    self.probs = []
    self._real = None

  def __enter__(self):
    import torch  # pylint: disable=g-import-not-at-top
    self._real = torch.multinomial

    def record(probs, num_samples, *a, **k):
      del a, k
      if num_samples != 1 or not self.tokens:
        raise RuntimeError("unexpected torch.multinomial call")
      self.probs.append(probs.detach().numpy().copy())
      return torch.as_tensor(np.array(self.tokens.pop(0)),
                             dtype=torch.long)[:, None]
    torch.multinomial = record
    return self

  def __exit__(self, *exc):
    import torch  # pylint: disable=g-import-not-at-top
    torch.multinomial = self._real


class _FixedLogits:
  """A stand-in `self` for upstream's GPT.generate: its forward returns the
  given [B, V] logits at the last position (block_size 1)."""

  def __init__(self, logits):
    import types  # pylint: disable=g-import-not-at-top
    self.logits = logits
    self.config = types.SimpleNamespace(block_size=1)

  def __call__(self, idx):
    del idx
    return self.logits[:, None, :].clone(), None


def draw_logits(rng, vocab: int = DRAW_VOCAB):
  """[R, V] float32 logits: random rows, integer-rounded rows (ties
  everywhere, also at the k-th) and a row whose 30 largest are equal."""
  rows = [rng.normal(0, 2.0, vocab) for _ in range(3)]
  rows += [np.round(rng.normal(0, 2.0, vocab)),
           np.round(rng.normal(0, 1.0, vocab) * 2) / 2]
  flat_top = rng.normal(0, 2.0, vocab)
  flat_top[40:70] = flat_top.max() + 0.25
  rows.append(flat_top)
  return np.stack(rows).astype(np.float32)


def run_draws(report, upstream, perturb: float) -> None:
  """The logit-level part of the draws check (see the docstring)."""
  import torch  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
  logits = draw_logits(np.random.default_rng(21))
  rows = logits.shape[0]
  kept_pairs, prob_items, all_draws, all_probs = [], [], [], []
  outside = total = ties_rows = 0
  for n, (temperature, top_k) in enumerate(DRAW_SETTINGS):
    mine = logits / np.float32(temperature) if perturb else logits
    ours = np.asarray(gpt.sampling_probs(jnp.asarray(mine), temperature,
                                         top_k))
    drawn = np.asarray(gpt._sample(  # pylint: disable=protected-access
        jnp.asarray(mine), jax.random.key(n), temperature, top_k))
    recorder = _Multinomial([drawn])
    with recorder:
      upstream.GPT.generate(_FixedLogits(torch.as_tensor(logits)),
                            torch.zeros(rows, 1, dtype=torch.long), 1,
                            temperature=temperature, top_k=top_k)
    theirs = recorder.probs[0]
    label = f"T={temperature} top_k={top_k}"
    kept_pairs.append((ours > 0, theirs > 0))
    if top_k:
      ties_rows += int(((theirs > 0).sum(-1) > top_k).sum())
    prob_items.append((label, ours, theirs,
                       np.broadcast_to(theirs.max(-1, keepdims=True),
                                       theirs.shape)))
    outside += int((theirs[np.arange(rows), drawn] <= 0).sum())
    total += rows
    tiled = jnp.asarray(np.repeat(mine, DRAW_N, axis=0))
    many = np.asarray(gpt._sample(  # pylint: disable=protected-access
        tiled, jax.random.key(1000 + n), temperature, top_k))
    all_draws += list(many.reshape(rows, DRAW_N))
    all_probs += list(theirs)
  settings = f"{len(DRAW_SETTINGS)} settings x {rows} rows"
  kept = common.compare_exact(f"draws: kept sets ({settings})", kept_pairs,
                              note=f"{ties_rows} rows where ties at the "
                              "k-th keep more than k")
  report.add(kept)
  report.add(common.compare_all("draws: probabilities after top-k",
                                prob_items, TOL_PROBS))
  report.add(common.Check(
      "draws: our single draws inside upstream's support", outside == 0,
      figures=f"{outside} of {total} outside", tol="exact"))
  report.add(common.draw_test(
      f"draws: ours vs upstream's probs, {DRAW_N} per row",
      np.stack(all_draws), np.stack(all_probs), alpha=DRAW_ALPHA,
      tests=len(all_draws), note=settings))


def run_case(report, label, vocab_size, bias, args, upstream, get_lr_factory,
             checks, tmp, port_module):
  import torch  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  from trm.core import lm_state  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import gpt_import  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import program as gpt_program  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import steps as gpt_steps  # pylint: disable=g-import-not-at-top

  add = report.add
  t = SIZES["block_size"]
  vocab_real = min(vocab_size, 50257)  # padded rows never appear as tokens
  model_args = dict(SIZES, vocab_size=vocab_size, bias=bias)
  torch.manual_seed(1337)
  ref = quiet(upstream.GPT, upstream.GPTConfig(**model_args))
  with torch.no_grad():
    # Every tensor moved off its init (norms off 1 and 0, weights larger),
    # so each maps somewhere that matters and the gradient norm exceeds
    # grad_clip (clipping binds).
    for name, p in ref.named_parameters():
      p.add_(WEIGHT_NOISE * torch.randn_like(p))
  initial_state = {k: v.clone() for k, v in ref.state_dict().items()}
  rng = np.random.default_rng(zlib.crc32(label.encode()))

  def save_ckpt(model, path, optimizer=None, iter_num=0, compiled=False):
    state = model.state_dict()
    if compiled:
      try:
        state = torch.compile(model).state_dict()  # lazy: keys only
      except Exception:  # pylint: disable=broad-except
        state = {"_orig_mod." + k: v for k, v in state.items()}
      assert all(k.startswith("_orig_mod.") for k in state)
    torch.save({"model": state,
                "optimizer": None if optimizer is None
                else optimizer.state_dict(),
                "model_args": dict(model_args), "iter_num": iter_num,
                "best_val_loss": torch.tensor(9.99),
                "config": {"dataset": "shakespeare_char"}}, path)
    return path

  def load(path):
    params, got_args, extras = gpt_import.load_nanogpt_checkpoint(
        path, optimizer=True)
    cfg = gpt.GPTConfig(**{k: got_args[k] for k in (
        "n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")})
    return _ours(params, args.perturb), cfg, extras

  x, y = _batches(rng, 1, vocab_real, t)[0]
  y = y.copy()
  y[0, :5] = -1  # ignore_index=-1 positions
  xt, yt = torch.from_numpy(x), torch.from_numpy(y)

  # ---- model: logits and loss through ckpt.pt, both key spellings
  ref.eval()
  ref.zero_grad(set_to_none=True)
  logits_t, loss_t = ref(xt, yt)
  loss_t.backward()
  grads_t = {n: p.grad.detach().numpy().copy()
             for n, p in ref.named_parameters()}
  logits_t = logits_t.detach().numpy()
  x_short = x[:, :37]
  with torch.no_grad():
    last_t, none_loss = ref(torch.from_numpy(x_short))
  assert none_loss is None
  params = cfg = None
  for compiled in (False, True):
    path = save_ckpt(ref, os.path.join(tmp, f"{label}_c{int(compiled)}.pt"),
                     compiled=compiled)
    params, cfg, _ = load(path)
    if "model" not in checks:
      break
    model = gpt.GPT(cfg)
    logits = model.apply({"params": params}, jnp.asarray(x, jnp.int32))
    loss = gpt_steps.cross_entropy(logits, jnp.asarray(y, jnp.int32))[0]
    key = "_orig_mod" if compiled else "plain"
    add(compare(f"{label} model {key} logits", logits, logits_t,
                TOL_FORWARD))
    add(compare(f"{label} model {key} loss", loss, loss_t.item(),
                TOL_FORWARD))
    if not compiled:
      last = model.apply({"params": params},
                         jnp.asarray(x_short, jnp.int32))[:, -1:]
      add(compare(f"{label} model targets=None logits", last,
                  last_t.numpy(), TOL_FORWARD))
  model = gpt.GPT(cfg)

  # ---- grads
  if "grads" in checks:
    def loss_fn(p):
      lg = model.apply({"params": p}, jnp.asarray(x, jnp.int32))
      return gpt_steps.cross_entropy(lg, jnp.asarray(y, jnp.int32))[0]
    grads = jax.grad(loss_fn)(params)
    add(compare_trees(f"{label} grads (every parameter)",
                      jax.tree.map(np.asarray, grads),
                      _torch_grads_in_our_layout(grads_t, model_args),
                      TOL_GRAD))

  # ---- optim: AdamW + get_lr + clipping + accumulation, then resume
  if checks & {"optim", "dropout", "bf16"}:
    get_lr = get_lr_factory(**{k: OPTIM[k] for k in (
        "learning_rate", "warmup_iters", "lr_decay_iters", "min_lr")})
    c = _config(vocab_size, bias, **OPTIM)
    program = gpt_program.build(c, None)
    step = jax.jit(program.train_step)
    fused = vocab_size == 65 and not bias  # one case on the fused kernel
    batches = _batches(rng, STEPS * ACCUM * 2, vocab_real, t)

    def upstream_run(model_t, optimizer, start, n, batch_iter,
                     ctx=contextlib.nullcontext):
      norms = []
      for it in range(start, start + n):
        lr = get_lr(it)
        for group in optimizer.param_groups:
          group["lr"] = lr
        for _ in range(ACCUM):
          bx, by = next(batch_iter)
          with ctx():
            _, l = model_t(torch.from_numpy(bx), torch.from_numpy(by))
          (l / ACCUM).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(
            model_t.parameters(), OPTIM["grad_clip"])))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
      return norms

    def ours_run(state, n, batch_iter, step=step):
      for _ in range(n):
        micro = [next(batch_iter) for _ in range(ACCUM)]
        # train_step's micro-batch k is rows k, k + ACCUM, ...
        bx = np.stack([m[0] for m in micro], 1).reshape(-1, t)
        by = np.stack([m[1] for m in micro], 1).reshape(-1, t)
        state, _ = step(state, {"x": jnp.asarray(bx, jnp.int32),
                                "y": jnp.asarray(by, jnp.int32)})
      return state

    def fresh_upstream(dtype=torch.float32, state=None, opt_state=None):
      m = quiet(upstream.GPT, upstream.GPTConfig(**model_args))
      m.load_state_dict(initial_state if state is None else state)
      m.to(dtype)
      m.train()
      opt = quiet(m.configure_optimizers, OPTIM["weight_decay"],
                  OPTIM["learning_rate"], (OPTIM["beta1"], OPTIM["beta2"]),
                  "cuda" if fused else "cpu")
      if opt_state is not None:  # torch casts the moments to float64
        opt.load_state_dict(opt_state)
      return m, opt

    def state_around(p, iter_num=0, adam=None):
      s = lm_state.make_init_fn(lambda key: p, gpt_steps.make_optimizer(c),
                                c.seed)()
      return s.replace(step=jnp.asarray(iter_num, jnp.int32),
                       opt_state=gpt_steps.with_adam_state(
                           s.opt_state, iter_num, adam))

    def upstream_params(m):
      return _torch_grads_in_our_layout(
          {n: p.detach().double().numpy().copy()
           for n, p in m.named_parameters()}, model_args)

    def judge(name, ours, theirs, truth, before, note):
      """ours against upstream (float32), and against upstream in float64
      (the truth): the tolerances grow with upstream's own float32 error,
      which AdamW's per-element normalisation makes large for elements
      whose gradient is near zero (the first step is about lr * sign(g))."""
      ours, theirs, truth, before = (_without_key_bias(t) for t in (
          ours, theirs, truth, before))
      scale = jax.tree.map(lambda a, b: a - b, truth, before)
      floor = compare_trees("", theirs, truth, 0.0, scale)
      # |ours - up32| <= |ours - f64| + |up32 - f64|: 4 + 1 floors.
      r = compare_trees(name, ours, theirs, max(TOL_PARAMS,
                                                5 * floor.max_rel), scale)
      r.add_note(note)
      add(r)
      r = compare_trees(name + " vs f64", ours, truth,
                        max(TOL_PARAMS, 4 * floor.max_rel), scale)
      r.add_note(f"upstream float32 vs float64: {floor.max_rel:.2e} "
                 f"({floor.note[len('worst: '):]})")
      add(r)

    ours_np = lambda s: jax.tree.map(np.asarray, s.params)  # noqa: E731
    start_params = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    case = numerics.Case(
        label, model_args, initial_state, params, cfg, x, y,
        lambda g: _torch_grads_in_our_layout(g, model_args),
        lambda **o: quiet(upstream.GPT,
                          upstream.GPTConfig(**dict(model_args, **o))))
    if "dropout" in checks:
      # set_values changes the config it is given: copies.
      c_drop = config_lib.set_values(copy.deepcopy(c),
                                     {"dropout": numerics.DROPOUT})
      numerics.run_dropout(report, case, lambda: numerics.train_step_masks(
          gpt_program.build(c_drop, None), state_around(params),
          batches[:2 * ACCUM], ACCUM, t))
    if "bf16" in checks:
      step16 = jax.jit(gpt_program.build(
          config_lib.set_values(copy.deepcopy(c), {"dtype": "bfloat16"}),
          None).train_step)

      def bf16_train(kind):
        if kind == "bfloat16":
          ours = ours_np(ours_run(state_around(params), STEPS, iter(batches),
                                  step16))
        else:
          m, opt = fresh_upstream()
          upstream_run(m, opt, 0, STEPS, iter(batches), ctx=(
              contextlib.nullcontext if kind is None else
              lambda: torch.autocast("cpu", dtype=torch.bfloat16)))
          ours = upstream_params(m)
        return _without_key_bias(ours), _without_key_bias(start_params)
      numerics.run_bf16(report, case, bf16_train)

  if "optim" in checks:
    tag = "fused AdamW" if fused else "AdamW"
    for start in (0, 5):
      m, opt = fresh_upstream()
      it_batches = iter(batches)
      norms = upstream_run(m, opt, start, STEPS, it_batches)
      m64, opt64 = fresh_upstream(torch.float64)
      upstream_run(m64, opt64, start, STEPS, iter(batches))
      ours = ours_run(state_around(params, start), STEPS, iter(batches))
      lrs = ", ".join(f"{get_lr(i):.2e}" for i in range(start, start + STEPS))
      judge(f"{label} optim it {start}-{start + STEPS - 1}", ours_np(ours),
            upstream_params(m), upstream_params(m64), start_params,
            f"{tag}; lr {lrs}; grad norms "
            + ", ".join(f"{g:.2f}" for g in norms))
      if start == 0:
        first_ckpt = save_ckpt(m, os.path.join(tmp, f"{label}_it4.pt"),
                               optimizer=opt, iter_num=STEPS, compiled=True)
        upstream_after = (m, opt, it_batches)
    # resume: upstream continues; ours restarts from upstream's ckpt.pt.
    m, opt, it_batches = upstream_after
    rest = list(it_batches)
    before = upstream_params(m)
    # Deep copies: a loaded optimizer state may share its `step` tensors.
    m64, opt64 = fresh_upstream(torch.float64, copy.deepcopy(m.state_dict()),
                                copy.deepcopy(opt.state_dict()))
    upstream_run(m64, opt64, STEPS, 3, iter(rest))
    upstream_run(m, opt, STEPS, 3, iter(rest))
    p2, _, extras = load(first_ckpt)
    adam = extras["adam"]
    adam = dict(adam, mu=jax.tree.map(jnp.asarray, adam["mu"]),
                nu=jax.tree.map(jnp.asarray, adam["nu"]))
    ours = ours_run(state_around(p2, extras["iter_num"], adam), 3,
                    iter(rest))
    judge(f"{label} optim resume it {STEPS}-{STEPS + 2}", ours_np(ours),
          upstream_params(m), upstream_params(m64), before,
          f"from ckpt.pt at iter_num {extras['iter_num']}, AdamW step "
          f"{adam['count']}")

  # ---- sample: greedy generation through the crop window
  if "sample" in checks:
    prompt = rng.integers(0, vocab_real, size=(2, 5))
    new = t + 16  # past block_size: nanoGPT crops to the last t tokens
    torch.manual_seed(0)
    ref.eval()
    with torch.no_grad():
      toks_t = ref.generate(torch.from_numpy(prompt), new, temperature=1.0,
                            top_k=1).numpy()
    for temperature, name in ((1.0, "top_k=1"), (0.0, "temperature=0")):
      toks = gpt.generate(model, params, jnp.asarray(prompt, jnp.int32), new,
                          jax.random.key(0), temperature=temperature,
                          top_k=1 if temperature else None)
      add(common.compare_exact(f"{label} sample {name} tokens",
                               [(np.asarray(toks), toks_t)]))

  # ---- draws: our sampling at temperature > 0 against upstream's generate
  if "draws" in checks:
    prompt = rng.integers(0, vocab_real, size=(2, 5))
    new = t + 8
    window = jax.jit(lambda p, x: model.apply({"params": p}, x))
    for temperature, top_k in ((0.8, None), (1.2, 20)):
      toks = np.asarray(gpt.generate(
          model, params, jnp.asarray(prompt, jnp.int32), new,
          jax.random.key(11), temperature=temperature, top_k=top_k))
      recorder = _Multinomial([toks[:, 5 + s] for s in range(new)])
      torch.manual_seed(0)
      with recorder, torch.no_grad():
        forced = ref.generate(torch.from_numpy(prompt), new,
                              temperature=temperature, top_k=top_k).numpy()
      if not np.array_equal(forced, toks):
        raise RuntimeError("upstream's generate did not take the recorded "
                           "tokens")
      theirs = np.stack(recorder.probs, axis=1)  # [B, new, V]
      steps = []
      for s in range(new):
        c = 5 + s  # context length before step s
        x = toks[:, :t] if c <= t else toks[:, c - t:c]
        steps.append(np.asarray(window(params, jnp.asarray(x, jnp.int32)))[
            :, min(c, t) - 1])
      ours = np.asarray(gpt.sampling_probs(jnp.asarray(np.stack(steps, 1)),
                                           temperature, top_k))
      drawn = np.take_along_axis(theirs, toks[:, 5:, None], -1)[..., 0]
      name = f"{label} draws T={temperature} top_k={top_k} {new} steps"
      add(Check(f"{name}: ours in support", bool((drawn > 0).all()),
                figures=f"{int((drawn <= 0).sum())} of {drawn.size} "
                "outside", tol="exact",
                note="upstream's probability of each token we drew"))
      add(compare(f"{name}: probs", ours, theirs, TOL_STEP_PROBS,
                  scale=np.broadcast_to(theirs.max(-1, keepdims=True),
                                        theirs.shape),
                  note="ours: our model's logits on the same contexts"))

  # ---- port: benchmarks/reference/nanogpt_torch.py against model.py
  if "port" in checks and port_module is not None:
    torch.manual_seed(7)
    up0 = quiet(upstream.GPT, upstream.GPTConfig(**model_args))
    torch.manual_seed(7)
    port0 = port_module.GPT(port_module.Config(**model_args))
    sd_u, sd_p = up0.state_dict(), port0.state_dict()
    same_keys = set(sd_u) == set(sd_p)
    r = compare_trees(f"{label} port init (seed 7)",
                      {k: sd_p[k].numpy() for k in sd_p} if same_keys else
                      {"keys": np.zeros(1)},
                      {k: sd_u[k].numpy() for k in sd_u} if same_keys else
                      {"keys": np.ones(1)}, 0.0)
    add(r)
    port = port_module.GPT(port_module.Config(**model_args))
    port.load_state_dict(initial_state)
    port.eval()
    lp, llp = port(xt, yt)
    llp.backward()
    add(compare(f"{label} port logits", lp.detach().numpy(), logits_t,
                TOL_FORWARD))
    add(compare(f"{label} port loss", llp.item(), loss_t.item(),
                TOL_FORWARD))
    with torch.no_grad():
      lastp, _ = port(torch.from_numpy(x_short))
    add(compare(f"{label} port targets=None logits", lastp.numpy(),
                last_t.numpy(), TOL_FORWARD))
    add(compare_trees(
        f"{label} port grads",
        _torch_grads_in_our_layout({n: p.grad.numpy() for n, p in
                                    port.named_parameters()}, model_args),
        _torch_grads_in_our_layout(grads_t, model_args), TOL_GRAD))
    # 4 iterations of train.py's loop on each.
    get_lr = get_lr_factory(**{k: OPTIM[k] for k in (
        "learning_rate", "warmup_iters", "lr_decay_iters", "min_lr")})
    batches = _batches(rng, STEPS * ACCUM, vocab_real, t)
    out = []
    for cls in ("upstream", "port"):
      if cls == "upstream":
        mdl = quiet(upstream.GPT, upstream.GPTConfig(**model_args))
      else:
        mdl = port_module.GPT(port_module.Config(**model_args))
      mdl.load_state_dict(initial_state)
      mdl.train()
      opt = quiet(mdl.configure_optimizers, OPTIM["weight_decay"],
                  OPTIM["learning_rate"], (OPTIM["beta1"], OPTIM["beta2"]),
                  "cpu")
      it_b = iter(batches)
      for it in range(STEPS):
        for group in opt.param_groups:
          group["lr"] = get_lr(it)
        for _ in range(ACCUM):
          bx, by = next(it_b)
          (mdl(torch.from_numpy(bx), torch.from_numpy(by))[1]
           / ACCUM).backward()
        torch.nn.utils.clip_grad_norm_(mdl.parameters(), OPTIM["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
      out.append(_torch_grads_in_our_layout(
          {n: p.detach().numpy().copy() for n, p in mdl.named_parameters()},
          model_args))
    init_ours = _torch_grads_in_our_layout(
        {k: v.numpy() for k, v in initial_state.items()},
        model_args)
    add(compare_trees(f"{label} port optim it 0-{STEPS - 1}", out[1], out[0],
                      TOL_PARAMS,
                      jax.tree.map(lambda a, b: a - b, out[0], init_ours)))


def run_data(report, args, upstream_dir, tmp) -> None:
  """Upstream's prepare.py on a copy of --input against our preparation;
  then the same on a copy of its first 100000 characters with CRLF line
  ends and one lone CR (prepare.py reads text mode: universal newlines)."""
  with open(args.input, "rb") as f:
    raw = f.read()
  crlf = raw[:100000].replace(b"\n", b"\r\n") + b"lone CR\rend\n"
  for tag, data in (("", raw), (" crlf", crlf)):
    _data_case(report, tag, data, upstream_dir,
               os.path.join(tmp, "data" + tag.strip()))


def _data_case(report, tag, data: bytes, upstream_dir, tmp) -> None:
  from trm.data.text import preparation  # pylint: disable=g-import-not-at-top
  from trm.data.text import windows  # pylint: disable=g-import-not-at-top
  up = os.path.join(tmp, "upstream")
  os.makedirs(up)
  shutil.copy(os.path.join(upstream_dir, "data", "shakespeare_char",
                           "prepare.py"), up)
  with open(os.path.join(up, "input.txt"), "wb") as f:
    f.write(data)
  proc = subprocess.run([sys.executable, "prepare.py"], cwd=up,
                        capture_output=True, text=True, check=False,
                        env=dict(os.environ, PYTHONIOENCODING="utf-8",
                                 PYTHONUTF8="1"))
  if proc.returncode:
    raise RuntimeError(f"upstream prepare.py failed: {proc.stderr[-2000:]}")
  ours_dir = os.path.join(tmp, "ours")
  source = os.path.join(tmp, "input.txt")
  with open(source, "wb") as f:
    f.write(data)
  meta = windows.ensure_prepared(ours_dir, source, "char", process_index=0)
  for name in (preparation.TRAIN_FILE, preparation.VAL_FILE):
    a = np.fromfile(os.path.join(ours_dir, name), np.uint8)
    b = np.fromfile(os.path.join(up, name), np.uint8)
    report.add(common.compare_exact(f"data{tag} {name} bytes", [(a, b)]))
  # Upstream's own meta.pkl, written just now in our temporary directory.
  with open(os.path.join(up, "meta.pkl"), "rb") as f:
    up_meta = pickle.load(f)
  vocab_ok = (meta["vocab_size"] == up_meta["vocab_size"]
              and {int(k): v for k, v in meta["itos"].items()}
              == up_meta["itos"] and meta["stoi"] == up_meta["stoi"])
  report.add(common.Check(
      f"data{tag} meta vocab_size/itos/stoi", vocab_ok,
      figures="equal" if vocab_ok else "differ",
      note=f"vocab {meta['vocab_size']} vs {up_meta['vocab_size']}"))


def _port_module():
  path = os.path.join(_REPO, "benchmarks", "reference", "nanogpt_torch.py")
  spec = importlib.util.spec_from_file_location("nanogpt_torch_port", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run(report, args) -> None:
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  upstream_dir = os.path.abspath(os.path.expanduser(args.upstream_dir))
  commit = upstream_commit(upstream_dir)
  upstream = import_upstream_model(upstream_dir)
  checks = set(args.checks)
  cases = [c for c in CASES if c[0] in args.cases]
  with tempfile.TemporaryDirectory() as tmp:
    get_lr_factory = lambda **g: upstream_get_lr(upstream_dir, **g)  # noqa
    port = _port_module() if "port" in checks else None
    if checks & {"model", "grads", "optim", "sample", "port", "draws",
                  "dropout", "bf16"}:
      for label, vocab, bias in cases:
        run_case(report, label, vocab, bias, args, upstream,
                 get_lr_factory, checks, tmp, port)
    if "draws" in checks:
      run_draws(report, upstream, args.perturb)
    if "data" in checks:
      run_data(report, args, upstream_dir, tmp)
    if "schedule" in checks:
      run_schedule(report, get_lr_factory)


def run_schedule(report, get_lr_factory) -> None:
  """Our learning-rate schedule against train.py's get_lr, value by value,
  for the shipped configs' schedules and the optim check's: every
  iteration around the warmup's end and lr_decay_iters, and a spread in
  between (an off-by-one shifts a whole warmup or cosine)."""
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import steps as gpt_steps  # pylint: disable=g-import-not-at-top
  for arg in (None, "shakespeare_char", "optim"):
    if arg == "optim":
      c = _config(65, True, **OPTIM)
    else:
      c = config_lib.load_config(os.path.join(_REPO, "configs", "gpt.py"),
                                 arg)
    keys = ("learning_rate", "warmup_iters", "lr_decay_iters", "min_lr")
    get_lr = get_lr_factory(**{k: c[k] for k in keys})
    w, d = c.warmup_iters, c.lr_decay_iters
    its = sorted({i for i in list(range(0, 4)) + list(range(w - 3, w + 4))
                  + list(range(d - 3, d + 4))
                  + list(np.linspace(0, d + 10, 200).astype(int)) if i >= 0})
    ours = gpt_steps.learning_rate_schedule(c)
    report.add(compare(
        f"schedule {arg or 'gpt2 (default)'}: lr at {len(its)} iterations "
        f"(warmup {w}, decay {d})",
        [float(ours(i)) for i in its], [get_lr(i) for i in its], 1e-6))


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    check_args(args)
  except UsageError as e:
    return common.refuse("upstream_nanogpt.py", e)
  commit = upstream_commit(os.path.abspath(os.path.expanduser(
      args.upstream_dir)))
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import torch  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  print(f"upstream karpathy/nanoGPT {args.upstream_dir} commit {commit}; "
        f"torch {torch.__version__}, jax {jax.__version__}, float32 CPU; "
        f"perturb {args.perturb}", flush=True)
  report = common.Report()
  run(report, args)
  return report.finish(args.json, upstream_commit=commit,
                       perturb=args.perturb)


if __name__ == "__main__":
  sys.exit(main())
