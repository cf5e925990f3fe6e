"""TRM parity against upstream's own PyTorch code (not our port of it).

Builds upstream SamsungSAILMontreal/TinyRecursiveModels' `ACTLossHead(
TinyRecursiveReasoningModel_ACTV1(config))` in float32 on the CPU, imports its
state_dict into ours with `trm.families.trm.torch_import`, and compares, for
the MLP-t (`configs/trm_sudoku.py:cpu`) and attention (`:cpu,att`) models:

  weights    import, export and `load_state_dict` back into upstream: exact
  train      6 ACT calls with carry in train mode (halting on q_halt > 0,
             rows reset onto new data): logits, q_halt, q_continue, z_H, z_L,
             halted, steps, loss and every ACTLossHead metric, and the
             gradient of every parameter and of the puzzle-embedding rows;
             once without exploration, once with it (upstream's
             torch.rand_like / randint_like replaced by our draws)
  eval       16 ACT steps in eval mode (plain puzzle-table lookup, no
             halting), every step, and `steps.eval_step`'s metrics against
             upstream `pretrain.evaluate`'s normalisation
  optimizer  3 train steps of upstream `pretrain.train_batch` (AdamATan2,
             CastedSparseEmbeddingSignSGD_Distributed with world_size 1,
             the warmup + cosine LR of `compute_lr`, then `EMAHelper`)
             against our `steps.train_step`: parameters, EMA, puzzle table,
             carry and train_batch's reduced metrics
  port       `benchmarks/reference/trm_torch.py` (our spec-written PyTorch
             step, the "upstream" side of the GPU speed ratios) against
             upstream on the same weights: forward, loss and 3 train steps
  bf16       forward_dtype bfloat16 on both sides (upstream's model rebuilt
             with it and the same float32 master weights; ours from the same
             checkpoint): H_init / L_init rounded as upstream rounds them
             (exact); the 6 ACT train calls (logits, q, z, losses, every
             gradient) and 3 train_batch steps (parameters, EMA, puzzle
             table) against upstream's bf16 run. bf16 cannot match to the
             bit (op order, accumulation), so each tensor passes when
             max_rel(ours, upstream bf16) <= 2 x max_rel(upstream fp32,
             upstream bf16) + 2^-9 on the same inputs (upstream's own
             distance is in the note). All three programs follow upstream
             bf16's halting decisions, so a q_halt that rounding moves
             across 0 cannot fork them; those decisions, and the argmax of
             the logits, are compared before that: PASS when all agree, INFO
             when the ones that differ sit within the bf16 bound of the
             boundary, FAIL otherwise. Losses and gradients are compared on
             the calls where every row's "solved" target (an argmax over all
             cells) agrees. After train_batch the floor is one flipped
             sign-like first step (2 x lr_1; puzzle table 2 x its lr).

Upstream is imported at run time from --upstream_dir (a work tree of the
repository); nothing of it is copied here. `pretrain.py` imports packages the
model does not need (hydra, omegaconf, coolname, argdantic, wandb): stand-in
modules are put in sys.modules only when those are missing. AdamATan2 is the
`adam_atan2` package of --adam_atan2_dir (imoneoi/adam-atan2, a work tree):
its CUDA extension `adam_atan2_backend` cannot build on a CPU machine, so a
stand-in backend runs the package's own pure-PyTorch reference
(`adam_atan2_test._adam_atan2_reference_impl`) on each tensor. Without
--adam_atan2_dir (and no importable adam_atan2) the optimizer checks are
skipped and say so.

Command (about 7 minutes on 2 CPU cores, 3 of them bf16: `--dtypes=float32`
or `--dtypes=bfloat16` runs one half; checked at TinyRecursiveModels
e7b6871 and adam-atan2 42a1aeb):
  git clone https://github.com/SamsungSAILMontreal/TinyRecursiveModels \
      /tmp/trm_upstream_wt
  git clone https://github.com/imoneoi/adam-atan2 /tmp/adam_atan2_wt
  PYTHONPATH=. python3 benchmarks/parity/upstream_trm.py \
      --upstream_dir=/tmp/trm_upstream_wt --adam_atan2_dir=/tmp/adam_atan2_wt

Prints one line per check in common.py's format (name, max abs / max rel
difference, tolerance, PASS/FAIL, the worst tensor) and exits 1 if any check
fails, 2 on a bad flag. `--perturb=NAME` adds 1e-2 to our copy of parameter
NAME (e.g. lm_head) after the import, so checks must FAIL; `--json=PATH`
writes every check.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import math
import os
import subprocess
import sys
import tempfile
import types

import numpy as np

# On the CPU whatever else is installed: with libtpu present, JAX would
# otherwise take the TPU runtime's host-wide lock.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # common.py beside this file
  sys.path.insert(0, _HERE)
import common  # pylint: disable=g-import-not-at-top,wrong-import-position
UPSTREAM_FILES = ("models/recursive_reasoning/trm.py", "models/losses.py",
                  "models/layers.py", "models/sparse_embedding.py",
                  "models/ema.py", "pretrain.py")
ADAM_FILES = ("adam_atan2/__init__.py", "adam_atan2/adam_atan2.py",
              "adam_atan2/adam_atan2_test.py")
METRICS = ("count", "accuracy", "exact_accuracy", "q_halt_accuracy", "steps",
           "lm_loss", "q_halt_loss")
VARIANTS = {"mlp_t": "cpu", "att": "cpu,att"}


# --------------------------------------------------------------- flags


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--upstream_dir", default="",
                 help="work tree of SamsungSAILMontreal/TinyRecursiveModels")
  p.add_argument("--adam_atan2_dir", default="",
                 help="work tree of imoneoi/adam-atan2 (optimizer checks)")
  p.add_argument("--variants", default="mlp_t,att",
                 help="comma list of " + ", ".join(VARIANTS))
  p.add_argument("--dtypes", default="float32,bfloat16",
                 help="comma list of forward dtypes to check: float32, "
                 "bfloat16")
  p.add_argument("--batch", type=int, default=6)
  p.add_argument("--perturb", default="",
                 help="add 1e-2 to our parameter with this name (test)")
  p.add_argument("--json", default="", help="write the rows here")
  p.add_argument("--seed", type=int, default=0)
  return p.parse_args(argv)


def check_flags(args) -> None:
  """Raises common.UsageError (one line naming the flag) on a bad flag;
  turns --variants and --dtypes into tuples of names."""
  if not args.upstream_dir:
    raise common.UsageError("--upstream_dir is required: a work tree of "
                            "SamsungSAILMontreal/TinyRecursiveModels")
  common.require_files("upstream_dir", args.upstream_dir, UPSTREAM_FILES,
                       "a TinyRecursiveModels")
  if args.adam_atan2_dir:
    common.require_files("adam_atan2_dir", args.adam_atan2_dir, ADAM_FILES,
                         "an imoneoi/adam-atan2")
  # From here on the two are tuples of names.
  args.variants = common.comma_list("variants", args.variants, VARIANTS)
  args.dtypes = common.comma_list("dtypes", args.dtypes,
                                  ("float32", "bfloat16"))
  if args.batch < 2:
    raise common.UsageError(f"--batch={args.batch} must be >= 2")
  common.require_json_dir(args.json)


def git_commit(path: str) -> str:
  try:
    out = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"],
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip() if out.returncode == 0 else "unknown (no git)"
  except (OSError, subprocess.SubprocessError):
    return "unknown (no git)"


# --------------------------------------------------------- comparison


class Checker(common.Report):
  """common.Report with this script's two ways to give a check's pairs."""

  def close(self, name, pairs, rtol):
    """Float check over one or more (ours, theirs) pairs, `ours` optionally
    (label, array): common.compare_all, each tensor against its own
    max|theirs| (so elements near 0 do not dominate)."""
    if not isinstance(pairs, list):
      pairs = [pairs]
    items = [(o[0], o[1], t) if isinstance(o, tuple) and isinstance(o[0], str)
             else ("", o, t) for o, t in pairs]
    return self.add(common.compare_all(name, items, rtol))

  def equal(self, name, pairs):
    """Integer / bool check over (ours, theirs) pairs: every element."""
    if not isinstance(pairs, list):
      pairs = [pairs]
    return self.add(common.compare_exact(name, pairs))


# ------------------------------------------------ upstream import shims


def _stub(name, **attrs):
  mod = types.ModuleType(name)
  mod.__dict__.update(attrs)
  mod.__shim__ = True
  return mod


def install_shims(adam_dir: str):
  """Stand-ins for packages upstream's pretrain.py imports but the model and
  train_batch never use, only when they are not installed."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  stubs = {
      "hydra": dict(main=lambda *a, **k: (lambda f: f)),
      "omegaconf": dict(DictConfig=dict),
      "coolname": dict(generate_slug=lambda n=2: "parity-run"),
      "argdantic": dict(ArgParser=type("ArgParser", (), {
          "__init__": lambda self, *a, **k: None,
          "command": lambda self, *a, **k: (lambda f: f),
          "__call__": lambda self, *a, **k: None})),
      "wandb": dict(run=None),
      "tqdm": dict(tqdm=None),
  }
  for name, attrs in stubs.items():
    if importlib.util.find_spec(name) is None:
      sys.modules[name] = _stub(name, **attrs)
  if adam_dir:
    sys.path.insert(0, os.path.abspath(adam_dir))

    def cuda_impl(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1,
                  beta2, weight_decay):
      # The package's own reference math (adam_atan2_test.py), per tensor,
      # with the constants its test derives from the step count.
      import torch  # pylint: disable=g-import-not-at-top
      from adam_atan2 import adam_atan2_test  # pylint: disable=g-import-not-at-top
      with torch.no_grad():
        _reference(adam_atan2_test, params, grads, exp_avgs, exp_avg_sqs,
                   steps, lr, beta1, beta2, weight_decay)

    def _reference(adam_atan2_test, params, grads, exp_avgs, exp_avg_sqs,
                   steps, lr, beta1, beta2, weight_decay):
      for p, g, m, v, s in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        t = float(s)
        new = adam_atan2_test._adam_atan2_reference_impl(  # pylint: disable=protected-access
            p, g, m, v, step_size=lr / (1 - beta1 ** t),
            wd_step_size=lr * weight_decay,
            bias_correction2_sqrt=math.sqrt(1 - beta2 ** t),
            beta1=beta1, beta2=beta2)
        for dst, src in zip((p, m, v), new):
          if dst is not src:
            dst.copy_(src)

    sys.modules["adam_atan2_backend"] = _stub(
        "adam_atan2_backend", adam_atan2_cuda_impl_=cuda_impl)
  elif importlib.util.find_spec("adam_atan2") is None:
    sys.modules["adam_atan2"] = _stub("adam_atan2", AdamATan2=None)


@contextlib.contextmanager
def cpu_cuda():
  """pretrain.train_batch moves the batch with `.cuda()`: keep it on CPU."""
  import torch  # pylint: disable=g-import-not-at-top
  saved = torch.Tensor.cuda
  torch.Tensor.cuda = lambda self, *a, **k: self
  try:
    yield
  finally:
    torch.Tensor.cuda = saved


@contextlib.contextmanager
def forced_draws(uniform, randint):
  """Upstream's exploration draws (torch.rand_like, torch.randint_like)
  return ours, so both sides explore the same rows."""
  import torch  # pylint: disable=g-import-not-at-top
  saved = torch.rand_like, torch.randint_like
  torch.rand_like = lambda like, *a, **k: torch.as_tensor(
      np.asarray(uniform), dtype=like.dtype)
  torch.randint_like = lambda like, *a, **k: torch.as_tensor(
      np.asarray(randint), dtype=like.dtype)
  try:
    yield
  finally:
    torch.rand_like, torch.randint_like = saved


# ------------------------------------------------------------- setup


def load_config(variant: str, explore: float, halt_max_steps: int):
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(
      os.path.join(ROOT, "configs", "trm_sudoku.py"), VARIANTS[variant])
  with config.unlocked():
    config.model.update(halt_exploration_prob=explore,
                        halt_max_steps=halt_max_steps)
    if variant == "att":  # a puzzle vector narrower than the prefix: padding
      config.model.puzzle_emb_ndim = config.model.hidden_size * 3 // 2
    config.optim.update(warmup_steps=2, lr=1e-3, puzzle_emb_lr=1e-2,
                        lr_min_ratio=0.1, weight_decay=0.1,
                        puzzle_emb_weight_decay=0.1, ema=True, ema_rate=0.9)
    config.total_steps = 4  # step 1 warmup, 2 peak, 3 half-way down cosine
  return config


NUM_PUZZLES, VOCAB, SEQ = 7, 11, 81
NET_SCALE = 0.3  # on upstream's init of the reasoning network (see below)


def upstream_arch(config, batch: int) -> dict:
  m = config.model
  return dict(batch_size=batch, seq_len=SEQ, vocab_size=VOCAB,
              num_puzzle_identifiers=NUM_PUZZLES,
              puzzle_emb_ndim=m.puzzle_emb_ndim, puzzle_emb_len=m.puzzle_emb_len,
              H_cycles=m.H_cycles, L_cycles=m.L_cycles, H_layers=0,
              L_layers=m.L_layers, hidden_size=m.hidden_size,
              expansion=m.expansion, num_heads=m.num_heads,
              pos_encodings=m.pos_encodings, rms_norm_eps=m.rms_norm_eps,
              rope_theta=m.rope_theta, halt_max_steps=m.halt_max_steps,
              halt_exploration_prob=m.halt_exploration_prob,
              forward_dtype=m.forward_dtype, mlp_t=m.mlp_t,
              no_ACT_continue=m.no_ACT_continue, causal=False)


def build_upstream(config, batch: int, seed: int):
  import torch  # pylint: disable=g-import-not-at-top
  from models.losses import ACTLossHead  # pylint: disable=g-import-not-at-top
  from models.recursive_reasoning.trm import TinyRecursiveReasoningModel_ACTV1  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  head = ACTLossHead(TinyRecursiveReasoningModel_ACTV1(
      upstream_arch(config, batch)), loss_type="stablemax_cross_entropy")
  inner = head.model.inner
  d = config.model.hidden_size
  with torch.no_grad():
    # Upstream zero-initialises both; random values make the puzzle rows and
    # the halting decision (q_halt around 0: rows halt early) visible.
    inner.puzzle_emb.weights.normal_(0.0, 0.5)
    inner.q_head.weight.normal_(0.0, 1.0 / math.sqrt(d))
    inner.q_head.bias.zero_()
    # At the plain init the recursion is chaotic: upstream against itself
    # with H_init changed by 1e-7 (relative) differs ~5x more after every ACT
    # step (MLP-t: 5e-2 of the logits' scale after 7 steps), so float32
    # rounding alone would separate any two programs. A smaller reasoning
    # network contracts instead (same test: < 1e-6 after 16 steps).
    for p in inner.L_level.parameters():
      p.mul_(NET_SCALE)
  # q_halt's bias at minus the median q_halt of a batch: about half the rows
  # halt on q_halt > 0 at each step.
  probe = copy.deepcopy(head).eval()
  batch = to_torch(Batches(seed + 99, batch)())
  with torch.no_grad():
    _, _, _, out, _ = probe(carry=probe.initial_carry(batch), batch=batch,
                            return_keys=["q_halt_logits"])
    inner.q_head.bias[0] = -out["q_halt_logits"].median()
  return head


def make_ours(config, state_dict_path: str, perturb: str, batch: int):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.core import state as core_state  # pylint: disable=g-import-not-at-top
  from trm.families.trm import model as trm_model  # pylint: disable=g-import-not-at-top
  from trm.families.trm import program as trm_program  # pylint: disable=g-import-not-at-top
  from trm.families.trm import steps as trm_steps  # pylint: disable=g-import-not-at-top
  from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
  from trm.families.trm.state import TrainState  # pylint: disable=g-import-not-at-top
  shapes = types.SimpleNamespace(vocab_size=VOCAB, seq_len=SEQ,
                                 num_puzzle_identifiers=NUM_PUZZLES)
  model = trm_program.make_model(config.model, shapes)
  params, buffers, puzzle_emb = torch_import.load_torch_checkpoint(
      state_dict_path, model.cfg)
  if perturb:
    params = perturb_params(params, perturb)
  tx = trm_steps.make_optimizer(config.optim, config.total_steps)
  state = TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
      ema_params=jax.tree.map(lambda x: x, params), buffers=buffers,
      puzzle_emb=puzzle_emb,
      carry=trm_model.empty_carry(model.cfg, batch),
      rng=jax.random.PRNGKey(1234), **core_state.zero_counters())
  return model, tx, state


def perturb_params(params, name: str, delta: float = 1e-2):
  """Adds `delta` to the first parameter whose path starts with `name`."""
  import jax  # pylint: disable=g-import-not-at-top
  flat = flat_tree(params)
  hits = sorted(k for k in flat if k.startswith(name))
  if not hits:
    raise SystemExit(f"--perturb={name}: no parameter starts so; have "
                     f"{', '.join(sorted(flat))}")
  key = lambda path: "/".join(str(getattr(k, "key", k)) for k in path)  # noqa: E731
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x + delta if key(path) == hits[0] else x, params)


def flat_tree(tree):
  """{'a/b': numpy value} of a nested dict of arrays."""
  from flax import traverse_util  # pylint: disable=g-import-not-at-top
  return {k: np.asarray(v)
          for k, v in traverse_util.flatten_dict(tree, sep="/").items()}


def upstream_name_map(model_cfg):
  """ours 'params/...' path -> (upstream key under model.inner, transpose)."""
  from trm.families.trm import torch_layout  # pylint: disable=g-import-not-at-top
  return {"/".join(e.path): (e.name, e.transpose)
          for e in torch_layout.entries(model_cfg) if e.collection == "params"}


class Batches:
  """Sudoku-shaped batches: some rows with few supervised cells, repeated
  puzzle ids, and (eval) one padded row as upstream's loader pads."""

  def __init__(self, seed, rows):
    self.rng, self.rows = np.random.default_rng(seed), rows

  def __call__(self, pad_row=False, correct=None):
    r = self.rng
    labels = r.integers(1, VOCAB, (self.rows, SEQ)).astype(np.int32)
    inputs = np.where(r.random((self.rows, SEQ)) < 0.5, 1, labels)
    labels[1, 3:] = -100          # a row with three supervised cells
    labels[2, : SEQ // 2] = -100  # half supervised
    ids = r.integers(1, NUM_PUZZLES, (self.rows,)).astype(np.int32)
    ids[-1] = ids[0]              # duplicate ids: summed sign-SGD grads
    if correct is not None:       # rows the model already solves
      for row, pred in correct.items():
        labels[row] = pred
    if pad_row:
      inputs[-1], labels[-1], ids[-1] = 0, -100, 0
    return {"inputs": inputs.astype(np.int32), "labels": labels,
            "puzzle_identifiers": ids}


def to_torch(batch):
  import torch  # pylint: disable=g-import-not-at-top
  return {k: torch.from_numpy(np.array(v)) for k, v in batch.items()}


# ------------------------------------------------------------- checks

FWD_TOL = 1e-5    # forward values, carry, losses (float32, rel to max)
GRAD_TOL = 1e-4   # gradients (float32 through L_cycles + 1 network calls)
STEP_TOL = 1e-5   # parameters after optimizer steps (rel to max |param|)


def check_weights(ck, tag, head, model, state, workdir):
  import torch  # pylint: disable=g-import-not-at-top
  from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
  sd = {k: v.detach().float().numpy() for k, v in head.state_dict().items()}
  names = upstream_name_map(model.cfg)
  ours = flat_tree(state.params)
  pairs = [((k, ours[k]), sd["model.inner." + n].T if t
            else sd["model.inner." + n]) for k, (n, t) in names.items()]
  pairs += [(("H_init", state.buffers["H_init"]), sd["model.inner.H_init"]),
            (("L_init", state.buffers["L_init"]), sd["model.inner.L_init"]),
            (("puzzle table", state.puzzle_emb["weights"]),
             sd["model.inner.puzzle_emb.weights"])]
  path = os.path.join(workdir, f"{tag}_export.pt")
  torch_import.export_torch_checkpoint(state.params, state.buffers,
                                       state.puzzle_emb, model.cfg, path,
                                       prefix="model.")
  fresh = copy.deepcopy(head)
  result = fresh.load_state_dict(torch.load(path, weights_only=True),
                                 strict=True)
  back = {k: v.float().numpy() for k, v in fresh.state_dict().items()}
  pairs += ([((k, back[k]), sd[k]) for k in sd] if not result.missing_keys
            else [(np.zeros(1), np.ones(1))])
  ck.close(f"{tag} weights: import, export, load_state_dict", pairs, 0.0)


def _draws(rng, rows, halt_max_steps):
  import jax  # pylint: disable=g-import-not-at-top
  explore_key, steps_key = jax.random.split(rng)
  return (np.asarray(jax.random.uniform(explore_key, (rows,))),
          np.asarray(jax.random.randint(steps_key, (rows,), 2,
                                        halt_max_steps + 1)))


def _our_call_fn(model, rows):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.families.trm import losses as trm_losses  # pylint: disable=g-import-not-at-top
  from trm.families.trm import model as trm_model  # pylint: disable=g-import-not-at-top

  @jax.jit
  def call(params, buffers, table, carry, batch, rng):
    variables = {"params": params, "buffers": buffers,
                 "puzzle_emb": {"weights": table}}
    carry = trm_model.reset_carry(model, variables, carry, batch)
    vectors = jnp.take(table, carry.puzzle_identifiers, axis=0)

    def loss_fn(p, vec):
      new_carry, outputs = trm_model.act_step(
          model, dict(variables, params=p), carry, vec, train=True, rng=rng)
      loss, metrics = trm_losses.act_loss(outputs, new_carry, train=True)
      return loss / rows, (new_carry, outputs, metrics, loss)

    (_, aux), grads = jax.value_and_grad(loss_fn, argnums=(0, 1),
                                         has_aux=True)(params, vectors)
    return aux, grads
  return call


def _upstream_grads(head, names):
  inner = head.model.inner
  out = {}
  for k, (n, t) in names.items():
    g = dict(inner.named_parameters())[n].grad
    g = np.zeros(1) if g is None else g.detach().numpy()
    out[k] = g.T if t else g
  return out


def _first_batch(head, batches):
  """The first batch, rows 0 and 3 labelled with what `head` (a copy of it)
  already predicts: solved rows, so halting has targets of both kinds."""
  import torch  # pylint: disable=g-import-not-at-top
  first = batches()
  dry = copy.deepcopy(head)
  with torch.no_grad():
    _, _, _, out, _ = dry(carry=dry.initial_carry(to_torch(first)),
                          batch=to_torch(first), return_keys=["preds"])
  preds = out["preds"].numpy()
  first["labels"][0] = preds[0]
  first["labels"][3] = preds[3]
  return first


def check_train(ck, tag, head, model, state, port, rows, seed, explore):
  """6 ACT calls in train mode; halting, resets, outputs, losses, grads."""
  import jax  # pylint: disable=g-import-not-at-top
  from trm.families.trm import model as trm_model  # pylint: disable=g-import-not-at-top
  head = copy.deepcopy(head)
  head.train()
  cfg = model.cfg
  names = upstream_name_map(cfg)
  batches = Batches(seed, rows)
  first = _first_batch(head, batches)
  call = _our_call_fn(model, rows)
  carry_o = trm_model.empty_carry(cfg, rows)
  carry_u = None
  carry_p = port.initial_carry(rows) if port is not None else None
  acc = {k: [] for k in ("logits", "q_halt", "q_cont", "z", "halted", "steps",
                          "loss", "metrics", "grads", "puzzle_grads",
                          "p_out", "p_z", "p_int", "p_loss", "p_grads",
                          "p_pgrads")}
  halts = []
  for i in range(6):
    batch = first if i == 0 else batches()
    rng = jax.random.PRNGKey(seed * 1000 + i)
    (carry_o, outs_o, metrics_o, loss_o), (grads_o, pgrads_o) = call(
        state.params, state.buffers, state.puzzle_emb["weights"], carry_o,
        batch, rng)
    u, r = _draws(rng, rows, cfg.halt_max_steps)
    draws = lambda: (forced_draws(u, r) if explore > 0  # noqa: E731
                     else contextlib.nullcontext())
    head.zero_grad(set_to_none=True)
    head.model.inner.puzzle_emb.local_weights.grad = None
    if carry_u is None:
      carry_u = head.initial_carry(to_torch(batch))
    with draws():
      carry_u, loss_u, metrics_u, outs_u, _ = head(
          carry=carry_u, batch=to_torch(batch),
          return_keys=["logits", "q_halt_logits", "q_continue_logits"])
    ((1 / rows) * loss_u).backward()
    halts.append(int(carry_u.halted.sum()))
    acc["logits"].append((np.asarray(outs_o["logits"]), outs_u["logits"]))
    acc["q_halt"].append((np.asarray(outs_o["q_halt_logits"]),
                          outs_u["q_halt_logits"]))
    acc["q_cont"].append((np.asarray(outs_o["q_continue_logits"]),
                          outs_u["q_continue_logits"]))
    acc["z"] += [(("z_H", np.asarray(carry_o.z_H)), carry_u.inner_carry.z_H),
                 (("z_L", np.asarray(carry_o.z_L)), carry_u.inner_carry.z_L)]
    acc["halted"].append((np.asarray(carry_o.halted), carry_u.halted))
    acc["steps"].append((np.asarray(carry_o.steps), carry_u.steps))
    acc["loss"].append((np.asarray(loss_o), loss_u.detach()))
    for k in METRICS:
      mine = (metrics_o["accuracy"].count if k == "count"
              else metrics_o[k].total)
      acc["metrics"].append(((k, np.asarray(mine)), metrics_u[k]))
    up_g = _upstream_grads(head, names)
    ours_g = flat_tree(grads_o)
    acc["grads"] += [((k, ours_g[k]), up_g[k]) for k in names]
    acc["puzzle_grads"].append(
        (np.asarray(pgrads_o), head.model.inner.puzzle_emb.local_weights.grad))
    if port is not None:
      with draws():
        carry_p, loss_p, metrics_p, local_p = port.forward_loss(
            carry_p, to_torch(batch))
      (loss_p / rows).backward()
      acc["p_out"].append((carry_p["z_H"], carry_u.inner_carry.z_H))
      acc["p_int"] += [(carry_p["halted"], carry_u.halted),
                       (carry_p["steps"], carry_u.steps)]
      acc["p_loss"].append((loss_p.detach(), loss_u.detach()))
      acc["p_loss"] += [((k, metrics_p[k]), metrics_u[k]) for k in METRICS]
      for k, (n, t) in names.items():
        g = port.p[k].grad
        acc["p_grads"].append(((k, g.T if t else g), up_g[k]))
        port.p[k].grad = None
      acc["p_pgrads"].append((local_p.grad,
                              head.model.inner.puzzle_emb.local_weights.grad))
  torchify = lambda pairs: [
      (tuple(o) if isinstance(o, tuple) else o,
       t.detach().numpy() if hasattr(t, "detach") else t) for o, t in pairs]
  for k in acc:
    acc[k] = [(o if not hasattr(o, "detach") else o.detach().numpy(), t)
              for o, t in torchify(acc[k])]
    acc[k] = [((o[0], o[1].detach().numpy() if hasattr(o[1], "detach")
                else o[1]) if isinstance(o, tuple) else o, t)
              for o, t in acc[k]]
  t = f"{tag} train{' explore' if explore else ''}"
  ck.close(f"{t} logits, q_halt/continue, z_H/z_L",
           acc["logits"] + acc["q_halt"] + acc["q_cont"] + acc["z"], FWD_TOL)
  ck.equal(f"{t} halted, steps (halts {halts})",
           acc["halted"] + acc["steps"] + acc["p_int"])
  ck.close(f"{t} loss, {len(METRICS)} metrics", acc["loss"] + acc["metrics"],
           FWD_TOL)
  ck.close(f"{t} grads ({len(names)} params, puzzle rows)",
           acc["grads"] + acc["puzzle_grads"], GRAD_TOL)
  if port is not None:
    ck.close(f"{t} trm_torch port: z, loss, metrics, grads",
             acc["p_out"] + acc["p_loss"] + acc["p_grads"] + acc["p_pgrads"],
             GRAD_TOL)


def check_eval(ck, tag, head, model, state, rows, seed, pad_row):
  """halt_max_steps ACT steps in eval mode, then eval_step's metrics."""
  import jax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from trm.families.trm import model as trm_model  # pylint: disable=g-import-not-at-top
  from trm.families.trm import steps as trm_steps  # pylint: disable=g-import-not-at-top
  head = copy.deepcopy(head)
  head.eval()
  cfg = model.cfg
  batch = Batches(seed + 7, rows)(pad_row=pad_row)
  variables = state.variables()
  step = jax.jit(lambda c: trm_model.act_step(
      model, variables, c, jax.numpy.take(state.puzzle_emb["weights"],
                                          c.puzzle_identifiers, axis=0),
      train=False))
  carry_o = trm_model.reset_carry(model, variables,
                                  trm_model.empty_carry(cfg, rows), batch)
  pairs, ints, n = {"out": [], "z": []}, [], 0
  with torch.inference_mode():
    carry_u = head.initial_carry(to_torch(batch))
    while True:
      carry_u, _, metrics_u, outs_u, done = head(
          carry=carry_u, batch=to_torch(batch),
          return_keys=["logits", "q_halt_logits", "q_continue_logits"])
      carry_o, outs_o = step(carry_o)
      n += 1
      pairs["out"] += [(np.asarray(outs_o[k]), outs_u[k].numpy()) for k in
                       ("logits", "q_halt_logits", "q_continue_logits")]
      pairs["z"] += [(np.asarray(carry_o.z_H), carry_u.inner_carry.z_H.numpy()),
                     (np.asarray(carry_o.z_L), carry_u.inner_carry.z_L.numpy())]
      ints += [(np.asarray(carry_o.halted), carry_u.halted.numpy()),
               (np.asarray(carry_o.steps), carry_u.steps.numpy())]
      if bool(done) or n > 64:
        break
  t = f"{tag} eval (batch{' with a padded row' if pad_row else ''})"
  ck.close(f"{t} {n} steps: logits, q, z_H/z_L", pairs["out"] + pairs["z"],
           FWD_TOL)
  ints.append((n, cfg.halt_max_steps))
  # steps.eval_step against pretrain.evaluate's normalisation (sums / count).
  metrics_o, preds_o, q_o = jax.jit(
      lambda s, b: trm_steps.eval_step(s, b, model=model, use_ema=False))(
          state, batch)
  count = float(metrics_u["count"])
  # Upstream sums q_halt_loss over every row, padded ones too (their empty
  # label set counts as solved: BCE(q_halt, 1)); ours over the counted rows.
  skip = ("count",) + (("q_halt_loss",) if pad_row else ())
  mine = [((k, float(metrics_o[k].total) / max(float(metrics_o[k].count), 1)),
           float(metrics_u[k]) / count) for k in METRICS if k not in skip]
  mine.append((("count", float(metrics_o["accuracy"].count)), count))
  mine.append((("preds", np.asarray(preds_o)),
               outs_u["logits"].argmax(-1).numpy()))
  ck.close(f"{t} eval_step metrics{' but q_halt_loss' if pad_row else ''}"
           ", preds", mine, FWD_TOL)
  ck.equal(f"{t} halted, steps, step count", ints)
  if pad_row:
    mine = float(metrics_o["q_halt_loss"].total) / float(
        metrics_o["q_halt_loss"].count)
    print(f"   note: eval q_halt_loss with a padded row: ours {mine:.6f}, "
          f"upstream {float(metrics_u['q_halt_loss']) / count:.6f} (upstream "
          "adds the padded row's BCE(q_halt, 1); a metric, not the model)")


def _upstream_trainer(head, config, rows, first):
  """(PretrainConfig, pretrain.TrainState, EMAHelper) around `head` (train
  mode) as upstream's launch builds them: sign-SGD on the puzzle table,
  AdamATan2 on the rest, EMA registered."""
  import pretrain  # pylint: disable=g-import-not-at-top
  from adam_atan2 import AdamATan2  # pylint: disable=g-import-not-at-top
  from models.ema import EMAHelper  # pylint: disable=g-import-not-at-top
  from models.sparse_embedding import CastedSparseEmbeddingSignSGD_Distributed  # pylint: disable=g-import-not-at-top
  oc = config.optim
  pc = pretrain.PretrainConfig(
      arch={"name": "trm", "loss": {"name": "losses@ACTLossHead"}},
      data_paths=["none"], global_batch_size=rows, epochs=1, lr=oc.lr,
      lr_min_ratio=oc.lr_min_ratio, lr_warmup_steps=oc.warmup_steps,
      weight_decay=oc.weight_decay, beta1=oc.beta1, beta2=oc.beta2,
      puzzle_emb_lr=oc.puzzle_emb_lr,
      puzzle_emb_weight_decay=oc.puzzle_emb_weight_decay, ema=oc.ema,
      ema_rate=oc.ema_rate)
  optimizers = [
      CastedSparseEmbeddingSignSGD_Distributed(
          head.model.puzzle_emb.buffers(), lr=0,
          weight_decay=pc.puzzle_emb_weight_decay, world_size=1),
      AdamATan2(head.parameters(), lr=0, weight_decay=pc.weight_decay,
                betas=(pc.beta1, pc.beta2))]
  ts = pretrain.TrainState(
      model=head, optimizers=optimizers,
      optimizer_lrs=[pc.puzzle_emb_lr, pc.lr],
      carry=head.initial_carry(to_torch(first)), step=0,
      total_steps=config.total_steps)
  ema = EMAHelper(mu=pc.ema_rate)
  ema.register(head)
  return pc, ts, ema


def check_optimizer(ck, tag, head, model, state, tx, config, port, rows,
                    seed):
  """3 steps of upstream pretrain.train_batch against steps.train_step."""
  import jax  # pylint: disable=g-import-not-at-top
  import pretrain  # pylint: disable=g-import-not-at-top
  from trm.families.trm import optim as trm_optim  # pylint: disable=g-import-not-at-top
  from trm.families.trm import steps as trm_steps  # pylint: disable=g-import-not-at-top
  head = copy.deepcopy(head)
  head.train()
  oc, cfg = config.optim, model.cfg
  batches = Batches(seed + 3, rows)
  data = [batches() for _ in range(3)]
  pc, ts, ema = _upstream_trainer(head, config, rows, data[0])
  step_fn = jax.jit(lambda s, b: trm_steps.train_step(
      s, b, model=model, tx=tx, optim_config=oc,
      total_steps=config.total_steps, global_batch_size=rows))
  schedule = trm_optim.lr_schedule(oc.lr, oc.warmup_steps, config.total_steps,
                                   oc.lr_min_ratio)
  carry_p = port.initial_carry(rows) if port is not None else None
  metric_pairs, lr_pairs, port_loss = [], [], []
  for batch in data:
    rng = jax.random.fold_in(state.rng, state.step)
    u, r = _draws(rng, rows, cfg.halt_max_steps)
    lr_pairs.append((float(schedule(state.step)), None))
    with cpu_cuda(), forced_draws(u, r):
      reduced = pretrain.train_batch(pc, ts, to_torch(batch), rows, rank=0,
                                     world_size=1)
    ema.update(head)
    state, metrics = step_fn(state, batch)
    lr_pairs[-1] = (lr_pairs[-1][0], reduced["train/lr"])
    for k in METRICS:
      if k == "count":
        continue
      m = metrics[k]
      metric_pairs.append(((k, float(m.total) / max(float(m.count), 1)),
                           float(reduced["train/" + k])))
    if port is not None:
      with forced_draws(u, r):
        carry_p, loss_p, _ = port.train_step(carry_p, to_torch(batch))
      port_loss.append(None)
  state = jax.device_get(state)
  names = upstream_name_map(cfg)
  inner = dict(head.model.inner.named_parameters())
  theirs = {k: inner[n].detach().numpy().T if t
            else inner[n].detach().numpy() for k, (n, t) in names.items()}
  shadow = {k: ema.shadow["model.inner." + n].numpy().T if t
            else ema.shadow["model.inner." + n].numpy()
            for k, (n, t) in names.items()}
  ours, ours_ema = flat_tree(state.params), flat_tree(state.ema_params)
  t = f"{tag} 3 train_batch"
  ck.close(f"{t} lr, metrics", lr_pairs + metric_pairs, FWD_TOL)
  ck.close(f"{t} params, EMA, puzzle table, carry",
           [((k, ours[k]), theirs[k]) for k in names]
           + [((k + " ema", ours_ema[k]), shadow[k]) for k in names]
           + [(("table", state.puzzle_emb["weights"]),
               head.model.inner.puzzle_emb.weights.numpy()),
              (("z_H", state.carry.z_H), ts.carry.inner_carry.z_H.numpy()),
              (("z_L", state.carry.z_L), ts.carry.inner_carry.z_L.numpy())],
           STEP_TOL)
  ck.equal(f"{t} halted, steps",
           [(state.carry.halted, ts.carry.halted.numpy()),
            (state.carry.steps, ts.carry.steps.numpy())])
  if port is not None:
    mine = port.params_numpy()
    port_ema = {k: (v.detach().numpy().T if k.endswith("kernel")
                    else v.detach().numpy()) for k, v in port.ema.items()}
    ck.close(f"{t} trm_torch port: params, EMA, table",
             [((k, mine[k]), theirs[k]) for k in names]
             + [((k + " ema", port_ema[k]), shadow[k]) for k in names]
             + [(("table", port.table.numpy()),
                 head.model.inner.puzzle_emb.weights.numpy())], STEP_TOL)


# ------------------------------------------------------------ bfloat16

# bfloat16 forward (upstream's CastedLinear / CastedEmbedding, ours'
# forward_dtype) cannot match to the bit: op order and accumulation differ.
# Each tensor passes when ours is no further from upstream's bf16 run than
# BF16_FACTOR times upstream's own bf16 run is from its float32 run, plus
# BF16_FLOOR (one bf16 rounding, 2^-9, relative to the tensor's max |value|).
BF16_FACTOR = 2.0
BF16_FLOOR = 2.0 ** -9


def bf16_compare(name, items, factor=BF16_FACTOR, floor=BF16_FLOOR,
                 note=""):
  """One check over (label, ours_bf16, upstream_bf16, upstream_fp32[,
  floor]) items: each passes when max_rel(ours, upstream_bf16) <= factor *
  max_rel(upstream_fp32, upstream_bf16) + floor (both against
  max |upstream_bf16| of that tensor; an item's own floor replaces
  `floor`). The figures and tol are the item nearest its bound (or a
  failing one); the note says upstream's own distance."""
  all_pass, max_abs, worst, own_worst = True, 0.0, None, None
  default_floor = floor
  for item in items:
    label, ours, theirs, fp32 = item[:4]
    floor = item[4] if len(item) > 4 else default_floor
    c = common.compare(label, np.asarray(ours, np.float64),
                       np.asarray(theirs, np.float64), math.inf)
    own = common.compare(label, np.asarray(fp32, np.float64),
                         np.asarray(theirs, np.float64), math.inf)
    bound = factor * own.max_rel + floor
    ok = c.passed and own.passed and c.max_rel <= bound
    all_pass = all_pass and ok
    if not math.isnan(c.max_abs):
      max_abs = max(max_abs, c.max_abs)
    ratio = c.max_rel / bound if bound > 0 else math.inf
    key = (not ok, ratio if not math.isnan(ratio) else math.inf)
    if worst is None or key > worst[0]:
      worst = (key, label, c, bound, own.max_rel)
    if own_worst is None or own.max_rel > own_worst[1]:
      own_worst = (label, own.max_rel)
  if worst is None:
    return common.Check(name, True, 0.0, 0.0, default_floor, note=note)
  _, label, c, bound, own = worst
  said = [f"worst: {label}, upstream bf16 vs its fp32 {own:.3e}"]
  if own_worst[0] != label:
    said.append(f"largest upstream bf16 vs fp32: {own_worst[1]:.3e} "
                f"({own_worst[0]})")
  if c.note:
    said.append(c.note)
  if note:
    said.append(note)
  check = common.Check(name, all_pass, max_abs, c.max_rel, bound,
                       note="; ".join(said))
  check.values = {"upstream_bf16_vs_fp32": own, "worst": label,
                  "factor": factor, "floor": floor}
  return check


def decision_check(name, ours, theirs, margin, borderline, own_agree,
                   what="upstream's margin"):
  """Discrete decisions (same-shape arrays) of ours and upstream in bf16
  (q_halt > 0; the argmax of the logits): a PASS check when every one
  agrees; INFO when the ones that differ all have upstream's `margin` (its
  distance from the decision boundary: |q_halt|, or top-1 minus the logit
  ours picked) <= `borderline`, a margin bf16 rounding can cross; FAIL
  otherwise."""
  ours, theirs = np.asarray(ours), np.asarray(theirs)
  margin = np.abs(np.asarray(margin, np.float64))
  differ = ours != theirs
  n, total = int(differ.sum()), differ.size
  figures = f"{total - n} of {total} agree"
  note = f"upstream bf16 vs its fp32: {own_agree}"
  if n == 0:
    return common.Check(name, True, tol="exact", figures=figures, note=note,
                        values={"differ": 0, "total": total})
  worst = float(margin[differ].max())
  note = (f"where they differ {what} <= {worst:.3e} (borderline: "
          f"<= {borderline:.3e}); {note}")
  return common.Check(name, worst <= borderline, tol="exact",
                      figures=figures, note=note, info=worst <= borderline,
                      values={"differ": n, "total": total, "margin": worst,
                              "borderline": borderline})


def bf16_config(variant, explore):
  config = load_config(variant, explore, halt_max_steps=3)
  with config.unlocked():
    config.model.forward_dtype = "bfloat16"
  return config


def build_upstream_like(head, config, rows):
  """Upstream's model for `config` (its forward_dtype) holding `head`'s
  float32 weights; H_init / L_init are rounded into upstream's own
  forward-dtype buffers by load_state_dict, as its checkpoints load."""
  from models.losses import ACTLossHead  # pylint: disable=g-import-not-at-top
  from models.recursive_reasoning.trm import TinyRecursiveReasoningModel_ACTV1  # pylint: disable=g-import-not-at-top
  out = ACTLossHead(TinyRecursiveReasoningModel_ACTV1(
      upstream_arch(config, rows)), loss_type="stablemax_cross_entropy")
  out.load_state_dict(head.state_dict(), strict=True)
  return out


def _np32(x):
  """float32 numpy of a torch tensor (bf16 too) or a JAX / numpy array."""
  if hasattr(x, "detach"):
    return x.detach().float().numpy()
  return np.asarray(x).astype(np.float32)


def check_bf16_weights(ck, tag, head_bf, state):
  """The bf16 H_init / L_init: upstream's buffers against ours (both the
  float32 values rounded to nearest even), and the forward dtype."""
  inner = head_bf.model.inner
  pairs = [(np.asarray(state.buffers[k]).astype(np.float32),
            getattr(inner, k).float().numpy()) for k in ("H_init", "L_init")]
  dtypes = [(str(np.asarray(state.buffers[k]).dtype),
             str(getattr(inner, k).dtype).replace("torch.", ""))
            for k in ("H_init", "L_init")]
  ck.equal(f"{tag} bf16 H_init/L_init as upstream rounds them",
           pairs + [([a for a, _ in dtypes], [b for _, b in dtypes])])


def check_bf16_train(ck, tag, head32, head_bf, model, state, rows, seed,
                     explore):
  """6 ACT train calls on three programs: upstream float32, upstream bf16,
  ours bf16. Every one continues from upstream bf16's halting decisions
  (a borderline q_halt flipped by rounding would otherwise reset different
  rows and fork the trajectories); the decisions are compared before that."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.families.trm import model as trm_model  # pylint: disable=g-import-not-at-top
  cfg = model.cfg
  names = upstream_name_map(cfg)
  heads = {"fp32": copy.deepcopy(head32).train(),
           "bf16": copy.deepcopy(head_bf).train()}
  batches = Batches(seed, rows)
  first = _first_batch(heads["bf16"], batches)
  call = _our_call_fn(model, rows)
  carry_o = trm_model.empty_carry(cfg, rows)
  carries = {"fp32": None, "bf16": None}
  keys = ("logits", "q_halt", "q_cont", "z_H", "z_L", "loss", "lm_loss",
          "q_halt_loss", "halted", "preds", "solved", "puzzle_grads") + tuple(
              names)
  rec = {side: {k: [] for k in keys} for side in ("ours", "fp32", "bf16")}
  for i in range(6):
    batch = first if i == 0 else batches()
    rng = jax.random.PRNGKey(seed * 1000 + i)
    (carry_o, outs_o, metrics_o, loss_o), (grads_o, pgrads_o) = call(
        state.params, state.buffers, state.puzzle_emb["weights"], carry_o,
        batch, rng)
    u, r = _draws(rng, rows, cfg.halt_max_steps)
    grads_o = flat_tree(grads_o)
    got = rec["ours"]
    for k, v in (("logits", outs_o["logits"]),
                 ("q_halt", outs_o["q_halt_logits"]),
                 ("q_cont", outs_o["q_continue_logits"]),
                 ("z_H", carry_o.z_H), ("z_L", carry_o.z_L), ("loss", loss_o),
                 ("lm_loss", metrics_o["lm_loss"].total),
                 ("q_halt_loss", metrics_o["q_halt_loss"].total),
                 ("halted", carry_o.halted), ("puzzle_grads", pgrads_o)):
      got[k].append(_np32(v))
    got["preds"].append(_np32(outs_o["logits"]).argmax(-1))
    got["solved"].append(_solved(got["preds"][-1], np.asarray(carry_o.labels)))
    for k in names:
      got[k].append(_np32(grads_o[k]))
    for side, head in heads.items():
      head.zero_grad(set_to_none=True)
      head.model.inner.puzzle_emb.local_weights.grad = None
      if carries[side] is None:
        carries[side] = head.initial_carry(to_torch(batch))
      with (forced_draws(u, r) if explore > 0 else contextlib.nullcontext()):
        carry_u, loss_u, metrics_u, outs_u, _ = head(
            carry=carries[side], batch=to_torch(batch),
            return_keys=["logits", "q_halt_logits", "q_continue_logits",
                         "preds"])
      ((1 / rows) * loss_u).backward()
      carries[side] = carry_u
      rec[side]["preds"].append(outs_u["preds"].numpy())
      rec[side]["solved"].append(_solved(
          rec[side]["preds"][-1], carry_u.current_data["labels"].numpy()))
      got = rec[side]
      for k, v in (("logits", outs_u["logits"]),
                   ("q_halt", outs_u["q_halt_logits"]),
                   ("q_cont", outs_u["q_continue_logits"]),
                   ("z_H", carry_u.inner_carry.z_H),
                   ("z_L", carry_u.inner_carry.z_L), ("loss", loss_u),
                   ("lm_loss", metrics_u["lm_loss"]),
                   ("q_halt_loss", metrics_u["q_halt_loss"]),
                   ("halted", carry_u.halted),
                   ("puzzle_grads",
                    head.model.inner.puzzle_emb.local_weights.grad)):
        got[k].append(_np32(v))
      up_g = _upstream_grads(head, names)
      for k in names:
        got[k].append(np.asarray(up_g[k], np.float32))
    # One trajectory: every program continues from upstream bf16's halts.
    ref = carries["bf16"].halted
    carries["fp32"] = dataclasses.replace(carries["fp32"], halted=ref.clone())
    carry_o = carry_o.replace(halted=jnp.asarray(ref.numpy()))
  stack = {side: {k: np.stack(v) for k, v in d.items()}
           for side, d in rec.items()}
  o, b, f = stack["ours"], stack["bf16"], stack["fp32"]
  items = lambda ks: [(k, o[k], b[k], f[k]) for k in ks]  # noqa: E731
  t = f"{tag} bf16 train{' explore' if explore else ''}"
  ck.add(bf16_compare(f"{t} logits, q_halt/continue, z_H/z_L",
                      items(("logits", "q_halt", "q_cont", "z_H", "z_L"))))
  # q_halt_loss (and the loss) target "row solved", the argmax of the bf16
  # logits on every labelled cell: a near-tie flipped by rounding changes
  # a row's target, so those are compared on the calls where every row's
  # target agrees (the argmax line below says how many cells differ).
  same = [i for i in range(len(b["solved"]))
          if (o["solved"][i] == b["solved"][i]).all()
          and (f["solved"][i] == b["solved"][i]).all()]
  pick = lambda a, k: a[k][same]  # noqa: E731
  picked = lambda ks: [(k, pick(o, k), pick(b, k), pick(f, k))  # noqa: E731
                       for k in ks]
  calls = len(b["solved"])
  on = (f"on the {len(same)} of {calls} calls where every row's 'solved' "
        "target agrees" if len(same) < calls else "")
  ck.add(bf16_compare(
      f"{t} loss, lm_loss, q_halt_loss",
      [("lm_loss", o["lm_loss"], b["lm_loss"], f["lm_loss"])]
      + picked(("loss", "q_halt_loss")),
      note=f"loss, q_halt_loss {on}" if on else ""))
  ck.add(bf16_compare(f"{t} grads ({len(names)} params, puzzle rows)",
                      picked(tuple(names) + ("puzzle_grads",)), note=on))
  # Decisions. Borderline: within what the bf16 bound on that tensor
  # allows (|q_halt| within the q_halt bound of 0; a logit gap within twice
  # the logits bound).
  q_bound = bf16_compare("q", items(("q_halt",))).tol
  borderline = q_bound * float(np.abs(b["q_halt"]).max())
  own = int((f["halted"] == b["halted"]).sum())
  ck.add(decision_check(
      f"{t} halting decisions (row, call)", o["halted"], b["halted"],
      b["q_halt"], borderline, f"{own} of {b['halted'].size} agree",
      what="|upstream q_halt|"))
  logits_bound = bf16_compare("logits", items(("logits",))).tol
  gap = (np.take_along_axis(b["logits"], b["preds"][..., None], -1)
         - np.take_along_axis(b["logits"], o["preds"][..., None], -1))[..., 0]
  own = int((f["preds"] == b["preds"]).sum())
  ck.add(decision_check(
      f"{t} argmax of the logits (call, row, cell)", o["preds"], b["preds"],
      gap, 2 * logits_bound * float(np.abs(b["logits"]).max()),
      f"{own} of {b['preds'].size} agree",
      what="upstream's top-1 minus the logit ours picked"))


def _solved(preds, labels):
  """Rows whose every labelled cell is predicted (upstream's seq_is_correct;
  a row without labels counts as solved)."""
  mask = labels != -100
  return ((preds == labels) | ~mask).all(-1)


def check_bf16_optimizer(ck, tag, head32, head_bf, model, state, tx, config,
                         rows, seed):
  """3 steps of upstream pretrain.train_batch in bf16 (and in float32, for
  upstream's own distance) against our bf16 steps.train_step: parameters,
  EMA, puzzle table. All three follow upstream bf16's halting decisions."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import pretrain  # pylint: disable=g-import-not-at-top
  from trm.families.trm import optim as trm_optim  # pylint: disable=g-import-not-at-top
  from trm.families.trm import steps as trm_steps  # pylint: disable=g-import-not-at-top
  oc, cfg = config.optim, model.cfg
  batches = Batches(seed + 3, rows)
  data = [batches() for _ in range(3)]
  sides = {k: _upstream_trainer(copy.deepcopy(h).train(), config, rows,
                                data[0])
           for k, h in (("fp32", head32), ("bf16", head_bf))}
  step_fn = jax.jit(lambda s, b: trm_steps.train_step(
      s, b, model=model, tx=tx, optim_config=oc,
      total_steps=config.total_steps, global_batch_size=rows))
  flips = total = 0
  for batch in data:
    rng = jax.random.fold_in(state.rng, state.step)
    u, r = _draws(rng, rows, cfg.halt_max_steps)
    for pc, ts, ema in sides.values():
      with cpu_cuda(), forced_draws(u, r):
        pretrain.train_batch(pc, ts, to_torch(batch), rows, rank=0,
                             world_size=1)
      ema.update(ts.model)
    state, _ = step_fn(state, batch)
    ref = sides["bf16"][1].carry.halted
    flips += int((np.asarray(state.carry.halted) != ref.numpy()).sum())
    total += ref.numel()
    ts32 = sides["fp32"][1]
    ts32.carry = dataclasses.replace(ts32.carry, halted=ref.clone())
    state = state.replace(carry=state.carry.replace(
        halted=jnp.asarray(ref.numpy())))
  state = jax.device_get(state)
  names = upstream_name_map(cfg)
  ours, ours_ema = flat_tree(state.params), flat_tree(state.ema_params)
  up = {}
  for side, (_, ts, ema) in sides.items():
    inner = dict(ts.model.model.inner.named_parameters())
    get = lambda n, t, src: (src[n].detach().float().numpy().T if t  # noqa: E731
                             else src[n].detach().float().numpy())
    up[side] = {k: get(n, t, inner) for k, (n, t) in names.items()}
    shadow = {n: ema.shadow["model.inner." + n] for _, (n, _) in names.items()}
    up[side].update({k + " ema": get(n, t, shadow)
                     for k, (n, t) in names.items()})
    up[side]["table"] = ts.model.model.inner.puzzle_emb.weights.float().numpy()
  mine = dict(ours)
  mine.update({k + " ema": ours_ema[k] for k in names})
  mine["table"] = np.asarray(state.puzzle_emb["weights"])
  # Floor: one flipped sign-like step. AdamATan2's first update is
  # lr_1 * atan(1 - b1) / (1 - b1) * sign(g) (~lr_1) whatever |g|, and the
  # puzzle table's sign-SGD every step's lr * sign(g): a gradient element
  # that bf16 rounds across 0 moves that parameter by twice the step.
  schedule = trm_optim.lr_schedule(oc.lr, oc.warmup_steps, config.total_steps,
                                   oc.lr_min_ratio)
  lr1 = float(schedule(0))
  emb_lr = max(float(trm_optim.lr_schedule(
      oc.puzzle_emb_lr, oc.warmup_steps, config.total_steps,
      oc.lr_min_ratio)(i)) for i in range(3))
  flip = lambda k: 2 * (emb_lr if k == "table" else lr1)  # noqa: E731
  ck.add(bf16_compare(
      f"{tag} bf16 3 train_batch params, EMA, puzzle table",
      [(k, mine[k], up["bf16"][k], up["fp32"][k],
        max(BF16_FLOOR, flip(k) / float(np.abs(up["bf16"][k]).max())))
       for k in up["bf16"]],
      note=f"floor: one flipped first step, 2 x lr_1 = {2 * lr1:.1e} "
      f"(table: 2 x puzzle lr = {2 * emb_lr:.1e}) over max |param|; halting "
      f"decisions: {total - flips} of {total} agree"))


# --------------------------------------------------------------- main


def check_float32(ck, variant, explore, config, head, path, args,
                  optimizer, workdir):
  """The float32 checks of one variant and exploration setting."""
  import jax  # pylint: disable=g-import-not-at-top
  import trm_torch  # pylint: disable=g-import-not-at-top
  model, tx, state = make_ours(config, path, args.perturb, args.batch)
  port = trm_torch.TorchTRM(
      model.cfg, jax.device_get(state.params),
      jax.device_get(state.buffers),
      np.asarray(state.puzzle_emb["weights"]), config.optim,
      config.total_steps)
  if explore == 0.0:
    check_weights(ck, variant, head, model, state, workdir)
  check_train(ck, variant, head, model, state, port, args.batch,
              args.seed, explore)
  if explore == 0.0:
    eval_config = load_config(variant, 0.0, halt_max_steps=16)
    eval_head = build_upstream(eval_config, args.batch, args.seed)
    eval_head.load_state_dict(head.state_dict())
    eval_model, _, eval_state = make_ours(eval_config, path,
                                          args.perturb, args.batch)
    for pad_row in (False, True):
      check_eval(ck, variant, eval_head, eval_model, eval_state,
                 args.batch, args.seed, pad_row)
  if optimizer:
    check_optimizer(ck, f"{variant}{' explore' if explore else ''}",
                    head, model, state, tx, config, port, args.batch,
                    args.seed)
  else:
    ck.skip(f"{variant} optimizer", "no --adam_atan2_dir and no "
            "importable adam_atan2")


def check_bfloat16(ck, variant, explore, head, path, args, optimizer):
  """The bf16 checks of one variant and exploration setting: upstream's
  model rebuilt with forward_dtype bfloat16 on the same float32 weights,
  ours from the same checkpoint with forward_dtype bfloat16."""
  config = bf16_config(variant, explore)
  head_bf = build_upstream_like(head, config, args.batch)
  model, tx, state = make_ours(config, path, args.perturb, args.batch)
  if explore == 0.0:
    check_bf16_weights(ck, variant, head_bf, state)
  check_bf16_train(ck, variant, head, head_bf, model, state, args.batch,
                   args.seed, explore)
  if explore == 0.0:
    if optimizer:
      check_bf16_optimizer(ck, variant, head, head_bf, model, state, tx,
                           config, args.batch, args.seed)
    else:
      ck.skip(f"{variant} bf16 optimizer", "no --adam_atan2_dir and no "
              "importable adam_atan2")


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    check_flags(args)
  except common.UsageError as e:
    return common.refuse("upstream_trm.py", e)
  sys.path.insert(0, os.path.abspath(args.upstream_dir))
  install_shims(args.adam_atan2_dir)
  import importlib.util  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_default_matmul_precision", "highest")
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
  sys.path.insert(0, os.path.join(ROOT, "benchmarks", "reference"))
  stub = getattr(sys.modules.get("adam_atan2"), "__shim__", False)
  optimizer = bool(args.adam_atan2_dir) or (
      not stub and importlib.util.find_spec("adam_atan2") is not None)
  print(f"upstream SamsungSAILMontreal/TinyRecursiveModels "
        f"{git_commit(args.upstream_dir)} ({os.path.abspath(args.upstream_dir)})")
  if args.adam_atan2_dir:
    print(f"adam-atan2 imoneoi/adam-atan2 {git_commit(args.adam_atan2_dir)} "
          "(reference math via a stand-in backend)")
  print(f"torch {torch.__version__}, jax {jax.__version__}, "
        f"{' and '.join(args.dtypes)} forward, batch "
        f"{args.batch}, seq 81 + 16 prefix, vocab {VOCAB}, "
        f"{NUM_PUZZLES} puzzle ids; tolerances are max|diff| / max|upstream| "
        "per tensor; bf16: each tensor within "
        f"{BF16_FACTOR:g} x upstream's own bf16-vs-fp32 max_rel + 2^-9")
  ck = Checker()
  dtypes = args.dtypes
  with tempfile.TemporaryDirectory() as workdir:
    for variant in args.variants:
      for explore in (0.0, 0.5):
        config = load_config(variant, explore, halt_max_steps=3)
        m = config.model
        if explore == 0.0:
          print(f"-- {variant}: configs/trm_sudoku.py:{VARIANTS[variant]} "
                f"hidden {m.hidden_size}, heads {m.num_heads}, H/L cycles "
                f"{m.H_cycles}/{m.L_cycles}, L_layers {m.L_layers}, "
                f"pos {m.pos_encodings}, puzzle_emb_ndim {m.puzzle_emb_ndim}"
                ", halt_max_steps 3 (train), 16 (eval)")
        head = build_upstream(config, args.batch, args.seed)
        path = os.path.join(workdir, f"{variant}.pt")
        torch.save(head.state_dict(), path)
        if "float32" in dtypes:
          check_float32(ck, variant, explore, config, head, path, args,
                        optimizer, workdir)
        if "bfloat16" in dtypes:
          check_bfloat16(ck, variant, explore, head, path, args, optimizer)
  return ck.finish(args.json, upstream_commit=git_commit(args.upstream_dir))

if __name__ == "__main__":
  sys.exit(main())
