r"""Cached block decoding (Dream / DiffuCoder): ours against Fast-dLLM's code.

  python3 benchmarks/parity/upstream_fastdllm.py \
      --upstream_dir=FASTDLLM_CHECKOUT [--upstream_git=FASTDLLM_GIT_DIR] \
      [--json=PATH] [--checks=model,generate] [--perturb]

`--upstream_dir` is a checkout of NVlabs/Fast-dLLM (its Dream code,
`dream/model/{configuration_dream,modeling_dream,generation_utils,
generation_utils_block}.py`), or a folder holding those four files. They are
imported from there at run time; nothing of theirs is copied here, and they
import under transformers 4.57 as they are (no stand-ins needed).
`--upstream_git` (a git dir of Fast-dLLM) names the commit whose tree holds
the same file contents; without it the files' blob ids are printed.

One small random Dream (float32, CPU; vocab 256, hidden 128, 3 layers, 4
query / 2 key-value heads, every weight random, LM head x20 so predictions
are peaked) is built by Fast-dLLM's `DreamModel`, saved with its
`save_pretrained` and read back by both sides (ours through `hf_config` +
`hf_import`), as `upstream_dream.py` does. Prompt 24 tokens, 48 new, blocks
of 16, greedy (temperature 0, no top-k / top-p on either side).

EXACT checks (PASS/FAIL; a float tolerance or every token equal). They hold
when our model, our cache primitives and our exact sampler compute what
Fast-dLLM's code computes:
  model     plain forward logits (batch 2); the refresh forward that fills
            Fast-dLLM's `past_key_values` vs our `cache.encode` (logits,
            values, and keys: theirs are cached before RoPE, ours after, so
            theirs get their own RoPE first); a prefix-cache forward (the
            block and everything after it, `past_key_values` cut at the
            block) and a dual-cache forward (the block only,
            `replace_position`) vs our `cache.window` at the block start, on
            a canvas with block tokens revealed since the refresh (so the
            cache is stale, as when decoding). Tolerance 1e-5 of max |value|.
  generate  (a) Fast-dLLM's uncached `generation_utils.diffusion_generate`
            vs our exact sampler (`sampling.diffusion_generate`), entropy and
            maskgit_plus; (b) Fast-dLLM's block decoding
            (`generation_utils_block`, prefix / dual cache, fixed steps /
            threshold) vs `emulate(..., upstream rules)`: this script's loop
            that runs Fast-dLLM's reveal rules on OUR model through OUR
            `cache.encode` / `cache.window`; (c) our cached sampler
            (`cached_sampling.cached_generate`) vs `emulate(..., our rules)`.
            (b) proves Fast-dLLM's cached decoding runs on our model and
            cache exactly; (c) that our jitted sampler does what the
            documented rules say; (d) our cached sampler with
            `fast_dllm=True` vs Fast-dLLM's block decoding itself.

MEASURED (INFO, not scored): our cached sampler vs Fast-dLLM's on the same
setting, and each one's agreement with the exact sampler. They differ BY
DESIGN (BUILD_NOTES "Cached block decoding"), and the emulation's two
switches attribute the difference:
  first   Fast-dLLM reveals the block's first token from the refresh
          forward unconditionally (fixed steps and threshold alike); ours
          reveals by the rule there (the schedule's first count, or the
          threshold rule).
  offset  Fast-dLLM's windows start at the block (the first position's
          prediction is approximated by its own output, unused as that
          token is already decoded); ours start one position before it (the
          window also refreshes that position's keys / values).
The INFO lines give the agreement of each mixed variant with both sides.
Fast-dLLM's fixed-step block rule ranks by entropy whatever `alg` says, so
ours runs with alg=entropy; its threshold rule indexes row 0 only, so the
threshold settings run batch 1 (two prompts, one at a time), and so do the
dual-cache ones (its `replace_position` must have one row: it takes the
positions of every row's True entries); prefix fixed steps run batch 2. Fast-dLLM's model ignores the positions it is passed (always
arange), so padded batches are not compared.

Each check prints one line in the parity scripts' format (`common.py`):
name, max abs / max rel diff (relative to the larger side's max |value|)
or "N of M differ", tolerance, PASS / FAIL / INFO. Exits 1 if any PASS/FAIL
check fails, 2 on a bad flag. `--perturb`
adds 1e-3 to one of OUR weights (layer 0's q_proj bias): exact checks FAIL.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import subprocess
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

MODEL_FILES = ("configuration_dream.py", "modeling_dream.py",
               "generation_utils.py", "generation_utils_block.py")
NESTED = "dream/model"
CHECKS = ("model", "generate")
TOL = 1e-5  # float32, relative to the larger side's max |value|


UsageError = common.UsageError


# ------------------------------------------------------------------- flags

@dataclasses.dataclass
class Options:
  upstream_dir: str = ""
  upstream_git: str = ""
  json: str = ""
  checks: tuple = CHECKS
  perturb: bool = False
  vocab: int = 256
  hidden: int = 128
  layers: int = 3
  prompt_len: int = 24
  new_tokens: int = 48
  block_length: int = 16
  threshold: float = 0.9
  head_scale: float = 20.0
  seed: int = 0


def parse_args(argv) -> Options:
  """`--name=value` flags (and `--perturb`); raises UsageError naming the
  flag. Checks the upstream folder before any heavy import."""
  opts = common.read_flags(argv, Options(), CHECKS)
  if opts.hidden % 8:
    raise UsageError(f"--hidden={opts.hidden} must be a multiple of 8 "
                     "(4 heads, even head dim)")
  if min(opts.layers, opts.prompt_len, opts.new_tokens) < 1 or opts.vocab < 64:
    raise UsageError("--vocab (>= 64), --layers, --prompt_len and "
                     "--new_tokens must be positive")
  if opts.block_length < 2 or opts.new_tokens % opts.block_length:
    raise UsageError(f"--block_length={opts.block_length} must be >= 2 and "
                     f"divide --new_tokens={opts.new_tokens}")
  if not 0 < opts.threshold <= 1:
    raise UsageError(f"--threshold={opts.threshold} must lie in (0, 1]")
  if not opts.upstream_dir:
    raise UsageError("--upstream_dir is required: a checkout of "
                     "NVlabs/Fast-dLLM (or a folder with its dream/model files)")
  model_dir(opts.upstream_dir)  # raises UsageError
  if opts.upstream_git and not os.path.isdir(opts.upstream_git):
    raise UsageError(f"--upstream_git={opts.upstream_git!r} is not a "
                     "directory")
  return opts


def model_dir(upstream_dir: str) -> str:
  """The folder holding Fast-dLLM's four Dream files."""
  if not os.path.isdir(upstream_dir):
    raise UsageError(f"--upstream_dir={upstream_dir!r} is not a directory")
  for folder in (os.path.join(upstream_dir, NESTED), upstream_dir):
    if all(os.path.isfile(os.path.join(folder, f)) for f in MODEL_FILES):
      return folder
  raise UsageError(
      f"--upstream_dir={upstream_dir!r} holds no Fast-dLLM Dream code "
      f"(neither {NESTED}/ nor the folder itself has "
      f"{', '.join(MODEL_FILES)})")


# ------------------------------------------- comparison helpers (shared)
# Check / compare_arrays / compare_tokens / perturb_params / blob_id /
# build_checkpoint / Ours come from the sibling Dream parity script (this
# folder is on sys.path, see the imports).
import upstream_dream as _h  # pylint: disable=g-import-not-at-top,wrong-import-position

Check = _h.Check
compare_arrays = _h.compare_arrays
compare_tokens = _h.compare_tokens
perturb_params = _h.perturb_params
blob_id = _h.blob_id
build_checkpoint = _h.build_checkpoint
Ours = _h.Ours


def info_tokens(name: str, ours, theirs) -> Check:
  """Token agreement as a measured (INFO) line."""
  check = compare_tokens(name, ours, theirs)
  check.tol, check.info = "-", True
  check.add_note("measured")
  return check


# ---------------------------------------------------------- upstream side

def import_upstream(upstream_dir: str):
  """Fast-dLLM's Dream modules, as a package of their folder."""
  os.environ.setdefault("USE_TF", "0")
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  package = "fastdllm_dream_model"
  module = types.ModuleType(package)
  module.__path__ = [os.path.abspath(model_dir(upstream_dir))]
  sys.modules[package] = module
  import importlib  # pylint: disable=g-import-not-at-top
  return types.SimpleNamespace(
      configuration=importlib.import_module(f"{package}.configuration_dream"),
      modeling=importlib.import_module(f"{package}.modeling_dream"),
      generation=importlib.import_module(f"{package}.generation_utils"),
      block=importlib.import_module(f"{package}.generation_utils_block"))


def upstream_files(upstream_dir: str) -> dict[str, str]:
  folder = model_dir(upstream_dir)
  return {os.path.relpath(os.path.join(folder, f), upstream_dir):
          blob_id(os.path.join(folder, f)) for f in MODEL_FILES}


def upstream_commit(opts: Options, files: dict[str, str]) -> str:
  """`git rev-parse HEAD` of a clean checkout, else the HEAD of
  --upstream_git when every file's blob id equals that tree's."""
  def git(*args, cwd=None):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True,
                          text=True, check=False)
  head = git("rev-parse", "HEAD", cwd=opts.upstream_dir)
  if head.returncode == 0 and not git(
      "status", "--porcelain", "--", *files, cwd=opts.upstream_dir).stdout:
    return head.stdout.strip()
  if opts.upstream_git:
    prefix = "" if next(iter(files)).startswith(NESTED) else NESTED + "/"
    commit = git("--git-dir", opts.upstream_git, "rev-parse",
                 "HEAD").stdout.strip()
    if all(git("--git-dir", opts.upstream_git, "rev-parse",
               f"{commit}:{prefix}{p}").stdout.strip() == b
           for p, b in files.items()):
      return commit + " (HEAD of --upstream_git; file contents match its tree)"
    return f"unknown (files differ from HEAD of {opts.upstream_git})"
  return "unknown (not a git work tree; pass --upstream_git)"


def upstream_generate(up, model, ids, *, block: bool, **kw):
  """Fast-dLLM's `diffusion_generate`: the uncached one of
  generation_utils, or generation_utils_block's (kw: block_length,
  threshold, dual_cache), bound to the model as its eval.py does."""
  import torch  # pylint: disable=g-import-not-at-top
  mixin = (up.block if block else up.generation).DreamGenerationMixin
  model.diffusion_generate = types.MethodType(mixin.diffusion_generate, model)
  model._sample = types.MethodType(mixin._sample, model)  # pylint: disable=protected-access
  gen_kw = {k: kw.pop(k) for k in ("steps", "alg", "max_new_tokens")
            if k in kw}
  gen_cfg = up.generation.DreamGenerationConfig(
      mask_token_id=model.config.mask_token_id,
      pad_token_id=model.config.pad_token_id,
      bos_token_id=model.config.bos_token_id,
      eos_token_id=model.config.eos_token_id, temperature=0.0, top_p=None,
      top_k=None, return_dict_in_generate=False, **gen_kw)
  with contextlib.redirect_stdout(io.StringIO()):  # its timing prints
    out = model.diffusion_generate(torch.as_tensor(ids),
                                   generation_config=gen_cfg, **kw)
  return (out.sequences if hasattr(out, "sequences") else out).numpy()


# --------------------------------------------------------------- our side

class OursCached:
  """Our cache primitives (jitted), our cached sampler and its emulation."""

  def __init__(self, ours):
    import jax  # pylint: disable=g-import-not-at-top
    from trm.families.dream import cache as dream_cache  # pylint: disable=g-import-not-at-top
    self.ours = ours
    self.model = dream_cache.cached_denoiser(ours.cfg)
    m = self.model
    self._encode = jax.jit(lambda p, x, pos: (
        lambda h, kv: (m.head(p, h), kv))(*m.encode(p, x, None, pos)))
    self._window = jax.jit(
        lambda p, x, pos, kv, start: m.head(
            p, m.window(p, x, pos, kv, start, None)))

  @property
  def params(self):
    return self.ours.params

  def encode(self, x):
    """(raw logits [B,L,V], cache (k, v) [layers,B,L,KV,K]) as numpy."""
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    b, n = x.shape
    pos = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
    logits, kv = self._encode(self.params, jnp.asarray(x, jnp.int32), pos)
    return np.asarray(logits), kv

  def window(self, x, start, width, kv):
    """Raw logits [B,width,V] of x[:, start:start+width] against `kv`."""
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    b = x.shape[0]
    pos = jnp.broadcast_to(jnp.arange(start, start + width, dtype=jnp.int32),
                           (b, width))
    return np.asarray(self._window(
        self.params, jnp.asarray(x[:, start:start + width], jnp.int32), pos,
        kv, start))

  def generate(self, ids, *, cache, block_length, threshold, steps, new,
               fast_dllm=False):
    import numpy as np  # pylint: disable=g-import-not-at-top
    from trm.families.dream import cached_sampling  # pylint: disable=g-import-not-at-top
    return np.asarray(cached_sampling.cached_generate(
        self.model, ids, None, params=self.params,
        mask_token_id=self.ours.cfg.mask_token_id, max_new_tokens=new,
        cache=cache, block_length=block_length, threshold=threshold,
        steps=steps, alg="entropy", temperature=0.0, top_p=None, top_k=None,
        fast_dllm=fast_dllm))


def _probs(logits):
  import numpy as np  # pylint: disable=g-import-not-at-top
  z = logits.astype(np.float32) - logits.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _confidence(logits, kind):
  """(confidence, greedy token) per position, float32: maskgit_plus is the
  top probability, entropy the negative entropy sum p log(p + 1e-10)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  p = _probs(logits)
  x0 = p.argmax(-1)
  if kind == "entropy":
    return (p * np.log(p + np.float32(1e-10))).sum(-1), x0
  return p.max(-1), x0


def emulate(oc: OursCached, ids, *, new, block_length, steps, threshold,
            dual, first, offset, eps=1e-3):
  """Cached block decoding on our model, rules switched (greedy).

  first="position0": the refresh forward reveals the block's first token
  (Fast-dLLM); "rule": it reveals by the rule (ours). offset 0: windows
  start at the block, whose first row predicts itself (Fast-dLLM's shift
  inside the window); offset 1: one position before it (ours). Fixed steps
  (threshold None) rank by entropy and reveal int(masked * (1 - s/t)) of
  the block per step (all at the last); threshold: the most confident and
  every other with top probability >= threshold, until the block is done.
  Returns (sequences, forwards run)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trm.families.dream import reveal_rules  # pylint: disable=g-import-not-at-top
  mask_id = oc.ours.cfg.mask_token_id
  b, p = ids.shape
  x = np.concatenate([np.asarray(ids), np.full((b, new), mask_id)], 1)
  length = p + new
  blocks = new // block_length
  per_block = steps // blocks
  ratios = reveal_rules.transfer_ratios(per_block, eps)
  kind = "maskgit_plus" if threshold is not None else "entropy"
  forwards = 0

  def reveal(x, rows, s, i):
    """rows [B, block, V]: row j predicts block position j; step i."""
    block = x[:, s:s + block_length]
    masked = block == mask_id
    conf, x0 = _confidence(rows, kind)
    conf = np.where(masked, conf, -np.inf)
    if threshold is None:
      left = np.float32(masked.sum() / b)
      count = (int(left * ratios[i]) if i < per_block - 1 else int(left))
      order = np.argsort(-conf, axis=-1, kind="stable")[:, :count]
      chosen = np.zeros_like(masked)
      np.put_along_axis(chosen, order, True, axis=-1)
      chosen &= masked
    else:
      best = conf.argmax(-1)[:, None]
      chosen = masked & ((conf >= threshold)
                         | (np.arange(block_length) == best))
    x[:, s:s + block_length] = np.where(chosen, x0, block)

  for j in range(blocks):
    s = p + j * block_length
    logits, kv = oc.encode(x)
    forwards += 1
    rows = logits[:, s - 1:s - 1 + block_length]
    if first == "position0":
      x[:, s] = rows[:, 0].argmax(-1)
    else:
      reveal(x, rows, s, 0)
    i = 1
    while (x[:, s:s + block_length] == mask_id).any():
      if threshold is None and i >= per_block:
        break  # Fast-dLLM's loop ends here whatever is left
      at = s - offset
      width = (s + block_length if dual else length) - at
      out = oc.window(x, at, width, kv)
      forwards += 1
      if offset:
        rows = out[:, :block_length]
      else:  # Fast-dLLM: cat([l[:, :1], l[:, :-1]]) inside the window
        rows = np.concatenate([out[:, :1], out[:, :block_length - 1]], 1)
      reveal(x, rows, s, i)
      i += 1
  return x, forwards


# ------------------------------------------------------------------ checks

def check_model(up, up_model, oc: OursCached, opts: Options,
                rng) -> list[Check]:
  """Plain forward, refresh (cache filled), prefix and dual windows."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  mask_id = up_model.config.mask_token_id
  p, n, bl = opts.prompt_len, opts.new_tokens, opts.block_length
  length = p + n
  x = rng.integers(1, opts.vocab - 1, (2, length))
  x[:, p + bl:] = mask_id  # blocks before this one decoded, the rest masked
  s, e = p + bl, p + 2 * bl  # the block decoded now
  refresh = x.copy()
  refresh[:, s:e] = mask_id
  step = refresh.copy()  # a few block tokens revealed since the refresh
  step[:, s:e:3] = rng.integers(1, opts.vocab - 1, step[:, s:e:3].shape)
  out = []
  with torch.no_grad():
    plain = up_model(torch.as_tensor(x), "full", None).logits.numpy()
  mine, _ = oc.encode(x)
  out.append(compare_arrays("model: plain forward logits (batch 2)", mine,
                            plain, TOL))
  with torch.no_grad():
    res = up_model(torch.as_tensor(refresh), "full", None, use_cache=True)
  mine, kv = oc.encode(refresh)
  out.append(compare_arrays("model: refresh forward logits", mine,
                            res.logits.numpy(), TOL))
  # Their cache: (k, v) per layer, [B, L, KV*K] before RoPE.
  kvh, hd = up_model.config.num_key_value_heads, oc.ours.cfg.head_dim
  pos = torch.arange(length)[None]
  ks, vs = [], []
  for k, v in res.past_key_values:
    k = k.view(2, length, kvh, hd).transpose(1, 2)
    cos, sin = up_model.model.rotary_emb(k, pos)
    _, k = up.modeling.apply_rotary_pos_emb(k, k, cos, sin)
    ks.append(k.transpose(1, 2).numpy())
    vs.append(v.view(2, length, kvh, hd).numpy())
  out.append(compare_arrays("model: refresh cache keys (theirs + RoPE)",
                            np.asarray(kv[0]), np.stack(ks), TOL))
  out.append(compare_arrays("model: refresh cache values",
                            np.asarray(kv[1]), np.stack(vs), TOL))
  # Prefix cache: their cache cut at the block, the block + suffix fresh.
  prefix = [(k[:, :s].clone(), v[:, :s].clone())
            for k, v in res.past_key_values]
  with torch.no_grad():
    theirs = up_model(torch.as_tensor(step[:, s:]), "full", None,
                      past_key_values=prefix, use_cache=True).logits.numpy()
  mine = oc.window(step, s, length - s, kv)
  out.append(compare_arrays("model: prefix-cache window logits (stale)",
                            mine, theirs, TOL))
  # Dual cache: the block only, replace_position (their cache is changed
  # in place: a copy).
  dual = [(k.clone(), v.clone()) for k, v in res.past_key_values]
  # (one row: Fast-dLLM takes the positions of every row's True entries,
  # so a [B, L] mask of B > 1 rows repeats them and fails)
  replace = torch.zeros(1, length, dtype=torch.bool)
  replace[:, s:e] = True
  with torch.no_grad():
    theirs = up_model(torch.as_tensor(step[:, s:e]), "full", None,
                      past_key_values=dual, use_cache=True, dual_cache=True,
                      replace_position=replace).logits.numpy()
  mine = oc.window(step, s, e - s, kv)
  out.append(compare_arrays("model: dual-cache window logits (stale)",
                            mine, theirs, TOL))
  # For scale: how far the stale window is from a fresh full forward.
  fresh, _ = oc.encode(step)
  c = compare_arrays("model: dual window vs fresh forward (ours)",
                     mine, fresh[:, s:e], TOL)
  c.info = True
  c.add_note("the cache's staleness, for scale")
  out.append(c)
  return out


SETTINGS = (  # name, cache, threshold?
    ("prefix, fixed steps", "prefix", False),
    ("dual, fixed steps", "dual", False),
    ("prefix, threshold", "prefix", True),
    ("dual, threshold", "dual", True),
)


def check_generate(up, up_model, oc: OursCached, opts: Options, rng,
                   emit) -> dict:
  """Each check goes to `emit` as it is made; returns the figures."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  p, n, bl = opts.prompt_len, opts.new_tokens, opts.block_length
  ids = rng.integers(1, opts.vocab - 1, (2, p))
  figures = {}

  # (a) The exact (uncached) samplers.
  exact = {}
  for alg in ("entropy", "maskgit_plus"):
    theirs = upstream_generate(up, up_model, ids, block=False, steps=n,
                               alg=alg, max_new_tokens=n)
    mine, _ = oc.ours.generate(ids, None, max_new_tokens=n, steps=n,
                               alg=alg, temperature=0.0, top_k=None)
    exact[alg] = mine
    emit(compare_tokens(f"generate: uncached, {alg}, steps {n}, batch 2",
                        mine[:, p:], theirs[:, p:]))
  ref = exact["entropy"][:, p:]
  share = float(np.mean([np.bincount(r).max() / len(r) for r in ref]))
  print(f"  (exact greedy text: top-token share {share:.2f}, "
        f"{len(np.unique(ref))} distinct tokens in {ref.size})")
  figures["exact_top_token_share"] = share
  # (b), (c) and the measured lines, per setting.
  for name, cache, thr in SETTINGS:
    threshold = opts.threshold if thr else None
    dual = cache == "dual"
    # Fast-dLLM's threshold rule reveals in row 0 only and its dual cache
    # reads the block's positions off every row of `replace_position`:
    # both run batch 1 (the two prompts one at a time).
    runs = [ids[:1], ids[1:]] if (thr or dual) else [ids]
    steps_list = [n] if thr else [n, n // 2]
    for steps in steps_list:
      label = f"{name}" + ("" if thr else f" {steps}") + (
          f" {threshold:g}" if thr else "")
      theirs, mine, mine_fd, emu = [], [], [], {}
      forwards = {}
      for batch in runs:
        kw = dict(block=True, block_length=bl, dual_cache=dual,
                  max_new_tokens=n, steps=steps)
        kw["alg"] = "confidence_threshold" if thr else "entropy"
        if thr:
          kw["threshold"] = threshold
        theirs.append(upstream_generate(up, up_model, batch, **kw))
        mine.append(oc.generate(batch, cache=cache, block_length=bl,
                                threshold=threshold, steps=steps, new=n))
        mine_fd.append(oc.generate(batch, cache=cache, block_length=bl,
                                   threshold=threshold, steps=steps, new=n,
                                   fast_dllm=True))
        for first in ("position0", "rule"):
          for offset in (0, 1):
            seq, f = emulate(oc, batch, new=n, block_length=bl, steps=steps,
                             threshold=threshold, dual=dual, first=first,
                             offset=offset)
            emu.setdefault((first, offset), []).append(seq)
            forwards[(first, offset)] = forwards.get((first, offset), 0) + f
      theirs = np.concatenate(theirs)[:, p:]
      mine = np.concatenate(mine)[:, p:]
      mine_fd = np.concatenate(mine_fd)[:, p:]
      emu = {k: np.concatenate(v)[:, p:] for k, v in emu.items()}
      emit(compare_tokens(f"gen {label}: Fast-dLLM == emulation",
                          emu[("position0", 0)], theirs))
      emit(compare_tokens(f"gen {label}: ours == emulation", mine,
                          emu[("rule", 1)]))
      emit(compare_tokens(f"gen {label}: ours fast_dllm == Fast-dLLM",
                          mine_fd, theirs))
      emit(info_tokens(f"gen {label}: ours vs Fast-dLLM", mine, theirs))
      # The threshold rule ranks by top probability: exact maskgit_plus.
      exact_rows = exact["maskgit_plus" if thr else "entropy"][:, p:]
      emit(info_tokens(f"gen {label}: Fast-dLLM vs exact", theirs,
                       exact_rows))
      emit(info_tokens(f"gen {label}: ours vs exact", mine, exact_rows))
      for key in (("rule", 0), ("position0", 1)):
        a = float(np.mean(emu[key] == theirs))
        o = float(np.mean(emu[key] == mine))
        c = Check(f"gen {label}: variant first={key[0]} offset={key[1]}",
                  True, tol="-", figures=f"agree Fast-dLLM {100 * a:6.2f}% "
                  f"ours {100 * o:6.2f}%", note="measured",
                  values={"fastdllm": a, "ours": o}, info=True)
        emit(c)
      figures[label] = {"forwards_fastdllm_rules": forwards[("position0", 0)],
                        "forwards_our_rules": forwards[("rule", 1)]}
      print(f"  (forwards run: Fast-dLLM rules {forwards[('position0', 0)]},"
            f" ours {forwards[('rule', 1)]})", flush=True)
  return figures


def run_checks(opts: Options, report: common.Report) -> dict:
  """Adds every check to `report`; returns the run's header (versions,
  upstream commit, figures)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  files = upstream_files(opts.upstream_dir)
  commit = upstream_commit(opts, files)
  up = import_upstream(opts.upstream_dir)
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_default_matmul_precision", "highest")
  info = {"upstream_commit": commit, "upstream_files": files,
          "torch": torch.__version__, "transformers": transformers.__version__,
          "jax": jax.__version__}
  print(f"upstream commit: {commit}")
  for path, blob in files.items():
    print(f"  {path} blob {blob}")
  print(f"torch {torch.__version__}, transformers {transformers.__version__},"
        f" jax {jax.__version__}")
  with tempfile.TemporaryDirectory(prefix="upstream_fastdllm_") as directory:
    up_model = build_checkpoint(up, opts, directory)
    ours = Ours(directory, opts.perturb)
  oc = OursCached(ours)
  print(f"model: vocab {opts.vocab}, hidden {opts.hidden}, {opts.layers} "
        f"layers, 4 q / 2 kv heads, float32, LM head x{opts.head_scale:g}; "
        f"prompt {opts.prompt_len} + {opts.new_tokens} new, blocks of "
        f"{opts.block_length}, threshold {opts.threshold:g}, greedy"
        + ("; PERTURBED (ours, q_proj bias)" if opts.perturb else ""),
        flush=True)
  if "model" in opts.checks:
    report.extend(check_model(up, up_model, oc, opts,
                              np.random.default_rng(1)))
  if "generate" in opts.checks:
    info["figures"] = check_generate(up, up_model, oc, opts,
                                     np.random.default_rng(3), report.add)
  return info


def main(argv) -> int:
  try:
    opts = parse_args(argv)
  except UsageError as e:
    return common.refuse("upstream_fastdllm.py", e)
  report = common.Report()
  info = run_checks(opts, report)
  return report.finish(opts.json or None, **info, perturb=opts.perturb)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
