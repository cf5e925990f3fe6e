"""nanoGPT's dropout and bfloat16 autocast against ours: the `dropout` and
`bf16` checks of upstream_nanogpt.py (see its docstring), one model
configuration at a time.

dropout  Torch's and JAX's random streams differ, so the masks are carried
         over: our model runs in training mode with every flax nn.Dropout
         call recorded (flax's method interceptor), and upstream's model
         runs with each of its nn.Dropout modules replaced by one that
         applies our mask of that call, in call order. Upstream is built
         on its non-flash attention path (its own code for torch < 2.0,
         chosen by hiding F.scaled_dot_product_attention while it is
         built), whose attn_dropout is a module; the flash path's dropout
         inside sdpa is the same operation on the same probabilities.
         Checked: as many calls of the same shapes, our scaling (kept
         values / (1 - p)), our keep rate, logits, loss and every
         gradient; then our jitted train step: fresh masks on every
         micro-batch and iteration (as torch's global generator gives
         nanoGPT) at the configured rate.
bf16     train.py on a GPU runs the model under torch.autocast(bfloat16)
         with float32 parameters; ours is `model.dtype='bfloat16'`. Each
         is compared with upstream in float32 (the truth here), and ours
         must come within 2x upstream's own autocast error: logits, loss,
         gradients, and the parameters after 4 AdamW iterations. Torch's
         CPU autocast is the stand-in for CUDA's (a GPU is not assumed).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from common import Check, compare, compare_trees  # pylint: disable=g-import-not-at-top

DROPOUT = 0.2  # config/train_shakespeare_char.py's
# bf16: ours may be this many times upstream's own autocast error, at least
# this floor (relative to the float32 values' largest magnitude).
BF16_FACTOR, BF16_FLOOR = 2.0, 1e-3
# The keep rate: within this many binomial standard deviations of 1 - p.
RATE_SIGMAS = 6.0


@dataclasses.dataclass
class Case:
  """What both checks share with upstream_nanogpt.run_case."""
  label: str
  model_args: dict     # GPTConfig(**model_args) upstream
  initial_state: dict  # upstream state_dict both start from
  params: dict         # the same weights in our layout (jnp)
  cfg: object          # our GPTConfig
  x: np.ndarray        # [B, T] tokens
  y: np.ndarray        # [B, T] targets, some -1
  grads_in_our_layout: object  # {upstream name: array} -> our tree
  new_upstream: object  # (**GPTConfig overrides) -> upstream GPT, quietly


# ------------------------------------------------------------- dropout


def our_dropout_calls(model, params, x, key):
  """(logits, [(module path, rate, input, output)]) of our model in
  training mode, every nn.Dropout call in call order."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  calls = []

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, nn.Dropout) and (
        context.method_name == "__call__"):
      calls.append(("/".join(context.module.path), context.module.rate,
                    np.asarray(args[0]), np.asarray(out)))
    return out

  with nn.intercept_methods(record):
    logits = model.apply({"params": params}, jnp.asarray(x, jnp.int32),
                         deterministic=False, rngs={"dropout": key})
  return np.asarray(logits), calls


class _GivenMask:
  """Stands in for each of upstream's nn.Dropout modules: applies the next
  recorded mask, as torch's dropout does (x * mask / (1 - p))."""

  def __init__(self, masks, p):
    self.masks, self.p, self.used, self.shapes = list(masks), p, 0, []

  def module(self, torch):
    owner = self

    class GivenMask(torch.nn.Module):

      def forward(self, x):
        owner.shapes.append(tuple(x.shape))
        if owner.used >= len(owner.masks):
          return x * 0.0  # counted; the check fails on the count
        mask = owner.masks[owner.used]
        owner.used += 1
        if mask.shape != tuple(x.shape):
          return x * 0.0
        return x * torch.from_numpy(mask).to(x.dtype) / (1.0 - owner.p)

    return GivenMask()


@contextlib.contextmanager
def _without_sdpa(torch):
  """Hides F.scaled_dot_product_attention: upstream's CausalSelfAttention
  then takes its own manual path (with attn_dropout as a module)."""
  f = torch.nn.functional
  sdpa = f.scaled_dot_product_attention
  del f.scaled_dot_product_attention
  try:
    yield
  finally:
    f.scaled_dot_product_attention = sdpa


def upstream_with_masks(torch, case: Case, masks, p):
  """Upstream's GPT (dropout p, training mode, manual attention) with our
  masks in place of its dropout draws, and the stand-in (for its count)."""
  with _without_sdpa(torch):
    ref = case.new_upstream(dropout=p)
  missing, unexpected = ref.load_state_dict(case.initial_state, strict=False)
  # The manual path registers the causal mask as a buffer named attn.bias.
  if unexpected or any(not k.endswith(".attn.bias") for k in missing):
    raise RuntimeError(f"upstream state_dict keys changed: missing "
                       f"{missing}, unexpected {unexpected}")
  given = _GivenMask(masks, p)
  for name, mod in list(ref.named_modules()):
    for child_name, child in list(mod.named_children()):
      if isinstance(child, torch.nn.Dropout):
        setattr(mod, child_name, given.module(torch))
  ref.train()
  return ref, given


def run_dropout(report, case: Case, step_check) -> None:
  """The dropout check for one model configuration (module docstring).
  `step_check()` -> (masks per micro-batch per iteration, rate) from our
  jitted train step."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import steps as gpt_steps  # pylint: disable=g-import-not-at-top

  add, label, p = report.add, case.label, DROPOUT
  model = gpt.GPT(dataclasses.replace(case.cfg, dropout=p))
  key = jax.random.key(5)
  logits, calls = our_dropout_calls(model, case.params, case.x, key)
  masks = [out != 0 for _, _, _, out in calls]

  # Our scaling and rate, from our own calls.
  scaled = [compare(path, out[m], inp[m] / (1.0 - rate), 0.0, scale="larger")
            for (path, rate, inp, out), m in zip(calls, masks)]
  worst = max((c.max_rel for c in scaled), default=np.inf)
  add(Check(f"{label} dropout: ours x / (1 - p) where kept",
            bool(scaled) and worst <= 1e-6 and all(
                rate == p for _, rate, _, _ in calls),
            max_rel=worst, max_abs=max((c.max_abs for c in scaled),
                                       default=np.inf), tol=1e-6,
            note=f"{len(calls)} calls at rate "
            f"{sorted({r for _, r, _, _ in calls})}"))
  add(_rate_check(f"{label} dropout: our keep rate",
                  [m[inp != 0] for m, (_, _, inp, _) in zip(masks, calls)],
                  p))

  ref, given = upstream_with_masks(torch, case, masks, p)
  ref.zero_grad(set_to_none=True)
  logits_t, loss_t = ref(torch.from_numpy(case.x), torch.from_numpy(case.y))
  loss_t.backward()
  ours_shapes = [tuple(m.shape) for m in masks]
  add(Check(f"{label} dropout: calls and shapes",
            ours_shapes == given.shapes,
            figures=f"ours {len(ours_shapes)}, upstream {len(given.shapes)}",
            note="in call order: " + ", ".join(
                "x".join(map(str, s)) for s in given.shapes[:4]) + " ..."))

  def loss_fn(params):
    lg = model.apply({"params": params}, jnp.asarray(case.x, jnp.int32),
                     deterministic=False, rngs={"dropout": key})
    return gpt_steps.cross_entropy(lg, jnp.asarray(case.y, jnp.int32))[0]

  # One program, not one compile per op.
  loss, grads = jax.jit(jax.value_and_grad(loss_fn))(case.params)
  add(compare(f"{label} dropout p={p} logits", logits,
              logits_t.detach().numpy(), 2e-5))
  add(compare(f"{label} dropout p={p} loss", loss, loss_t.item(), 2e-5,
              note=f"loss {float(loss):.4f}"))
  add(compare_trees(
      f"{label} dropout p={p} grads (every parameter)",
      jax.tree.map(np.asarray, grads),
      case.grads_in_our_layout({n: q.grad.numpy()
                                for n, q in ref.named_parameters()}),
      1e-4))

  # The train step: fresh masks on every micro-batch and iteration.
  step_masks, rate = step_check()
  flat = [m for it in step_masks for m in it]
  distinct = len({m.tobytes() for m in flat})
  add(Check(f"{label} dropout: train step masks fresh per micro-batch",
            len(flat) > 1 and distinct == len(flat) and rate == p,
            figures=f"{distinct} distinct of {len(flat)}",
            note=f"{len(step_masks)} iterations x "
            f"{len(step_masks[0]) if step_masks else 0} micro-batches, the "
            "embedding's dropout"))
  add(_rate_check(f"{label} dropout: train step keep rate", flat, p))


def _rate_check(name, masks, p) -> Check:
  kept = sum(int(m.sum()) for m in masks)
  n = sum(m.size for m in masks)
  expect = 1.0 - p
  sigma = np.sqrt(expect * p / max(n, 1))
  z = abs(kept / max(n, 1) - expect) / sigma
  return Check(name, n > 0 and z <= RATE_SIGMAS,
               figures=f"{kept / max(n, 1):.4f} of {n} ({z:.1f} sigma)",
               tol=f"{RATE_SIGMAS:g} sigma", note=f"expected {expect:g}")


def train_step_masks(program, state, batches, accum, t):
  """Our jitted train step on `batches` with the embedding dropout's mask
  of every micro-batch shipped out through a debug callback: [[mask per
  micro-batch] per iteration] and the rate the step applied."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  got, rates = [], set()

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, nn.Dropout) and (
        context.module.path[-1] == "drop"):
      rates.add(context.module.rate)
      jax.debug.callback(lambda m: got[-1].append(np.asarray(m)), out != 0,
                         ordered=True)
    return out

  def stepped(s, b):
    with nn.intercept_methods(record):
      return program.train_step(s, b)

  step = jax.jit(stepped)
  it = iter(batches)
  for _ in range(len(batches) // accum):
    got.append([])
    micro = [next(it) for _ in range(accum)]
    bx = np.stack([m[0] for m in micro], 1).reshape(-1, t)
    by = np.stack([m[1] for m in micro], 1).reshape(-1, t)
    state, _ = step(state, {"x": jnp.asarray(bx, jnp.int32),
                            "y": jnp.asarray(by, jnp.int32)})
    jax.effects_barrier()
  return got, (rates.pop() if len(rates) == 1 else None)


# ------------------------------------------------------------- bf16


def upstream_autocast(torch, case: Case, dtype=None):
  """Upstream's logits, loss and gradients (our layout) in float32, or
  under torch.autocast(cpu, dtype) as train.py's `ctx` on a GPU."""
  ref = case.new_upstream()
  ref.load_state_dict(case.initial_state)
  ref.eval()
  ctx = (contextlib.nullcontext() if dtype is None
         else torch.autocast("cpu", dtype=dtype))
  with ctx:
    logits, loss = ref(torch.from_numpy(case.x), torch.from_numpy(case.y))
  loss.backward()
  loss = loss.detach()
  grads = case.grads_in_our_layout({n: q.grad.float().numpy()
                                    for n, q in ref.named_parameters()})
  return logits.float().detach().numpy(), loss.item(), grads


def judge_bf16(name, ours, autocast, truth, scale=None) -> Check:
  """ours (bf16) and upstream's autocast, each against upstream float32:
  ours within BF16_FACTOR x upstream's own error (at least BF16_FLOOR)."""
  if isinstance(truth, dict):
    floor = compare_trees("", autocast, truth, 0.0, scale)
    tol = max(BF16_FLOOR, BF16_FACTOR * floor.max_rel)
    r = compare_trees(name, ours, truth, tol, scale)
  else:
    floor = compare("", autocast, truth, 0.0, scale=scale)
    tol = max(BF16_FLOOR, BF16_FACTOR * floor.max_rel)
    r = compare(name, ours, truth, tol, scale=scale)
  r.add_note(f"upstream autocast vs float32: {floor.max_rel:.2e}")
  return r


def run_bf16(report, case: Case, train) -> None:
  """The bf16 check for one model configuration. `train(dtype)` runs 4
  AdamW iterations: dtype None / 'autocast' / 'float32' gives upstream in
  float32 / under autocast / ours in float32, 'bfloat16' ours in bf16;
  each returns (parameters in our layout, the starting parameters)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import steps as gpt_steps  # pylint: disable=g-import-not-at-top

  add, label = report.add, case.label
  truth = upstream_autocast(torch, case)
  auto = upstream_autocast(torch, case, torch.bfloat16)
  model = gpt.GPT(dataclasses.replace(case.cfg, dtype="bfloat16"))

  def loss_fn(params):
    lg = model.apply({"params": params}, jnp.asarray(case.x, jnp.int32))
    return gpt_steps.cross_entropy(lg, jnp.asarray(case.y, jnp.int32))[0], lg

  (loss, logits), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
      case.params)
  grads = jax.tree.map(lambda g: np.asarray(g, np.float32), grads)
  add(judge_bf16(f"{label} bf16 logits", np.asarray(logits, np.float32),
                 auto[0], truth[0]))
  add(judge_bf16(f"{label} bf16 loss", float(loss), auto[1], truth[1]))
  add(judge_bf16(f"{label} bf16 grads (every parameter)", grads, auto[2],
                 truth[2]))
  theirs32, start = train(None)
  ours16, _ = train("bfloat16")
  theirs16, _ = train("autocast")
  # AdamW moves an element whose gradient is near zero by about lr *
  # sign(g) whatever its size, so bf16 rounding flips whole updates there
  # (as it does upstream): the figure is over all elements together.
  errors = [rms_rel(t, theirs32, start) for t in (ours16, theirs16)]
  tol = max(BF16_FLOOR, BF16_FACTOR * errors[1])
  add(Check(f"{label} bf16 AdamW 4 iterations", errors[0] <= tol,
            figures=f"rms_rel {errors[0]:.3e}", tol=tol,
            note=f"upstream autocast vs float32: {errors[1]:.2e}; of the "
            "change the iterations made, all parameters together"))


def rms_rel(ours: dict, truth: dict, start: dict) -> float:
  """|ours - truth| / |truth - start| over every element of the trees."""
  from common import leaves  # pylint: disable=g-import-not-at-top
  a, b, c = ([np.asarray(v, np.float64).ravel() for _, v in leaves(t)]
             for t in (ours, truth, start))
  a, b, c = (np.concatenate(list(v)) for v in (a, b, c))
  moved = np.linalg.norm(b - c)
  # Nothing moved (a zero learning rate): nothing to compare, a failure.
  return float(np.linalg.norm(a - b) / moved) if moved else math.inf
