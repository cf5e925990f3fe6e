r"""Dream / DiffuCoder: our JAX port against upstream's own PyTorch code.

  python3 benchmarks/parity/upstream_dream.py --upstream_dir=DLLM_CHECKOUT \
      [--upstream_git=DLLM_GIT_DIR] [--json=PATH] \
      [--checks=forward,sampling,loss,reference,draws,export] [--perturb]

`--upstream_dir` is a checkout of ZHZisZZ/dllm (its Dream HF remote code,
`dllm/pipelines/dream/models/{configuration_dream,modeling_dream,
generation_utils}.py`, and its trainers `dllm/core/trainers/mdlm.py`,
`dllm/pipelines/dream/trainer.py`), or a folder holding just the three
model files (then the loss check is skipped). Upstream's modules are
imported from there at run time; nothing of theirs is copied here. dllm's
package `__init__`s pull in accelerate / peft / datasets / torchmetrics for
parts these checks never run: where those are not installed, empty stand-in
modules are registered so that the imports succeed (`_shim_missing`).
`--upstream_git` (a git dir of dllm) names the commit whose tree holds the
same file contents (by git blob id: HEAD, else the newest commit touching
them that matches); without it the blob ids are printed. transformers 4.57
runs it; `diffusion_generate` gets an explicit `DreamGenerationConfig`
(dllm's HEAD renamed `return_dict_in_generate`, which the implicit
`from_model_config` path of transformers 4.57 still reads).

One small random Qwen2-shaped Dream (float32; vocab 1024, hidden 128, 2
layers, 4 query / 2 key-value heads, RoPE theta 1e6, every weight and bias
random, the LM head scaled x20 for peaked predictions) is built by
upstream's `DreamModel`, saved with its `save_pretrained` (safetensors + its
config.json) and read back by both: upstream's `from_pretrained` and our
`hf_config.model_config_from_hf` + `hf_import.load_hf_checkpoint`. Checks:

  forward    raw logits, full attention and a left-padded batch (2-D mask
             -> pairwise 4-D mask, positions cumsum(mask) - 1, real
             positions compared), the shifted logits the samplers use, and
             bfloat16 compute on both sides (bf16 tolerance).
  sampling   upstream `diffusion_generate` vs `trm.families.dream.sampling.
             diffusion_generate` (the model's Denoiser), greedy
             (temperature 0), for maskgit_plus / topk_margin / entropy, steps
             = and < new tokens, top-k/top-p filters, a left-padded batch:
             final tokens and the history after every step must be equal.
             With top_p=0.95 this peaked model keeps one token at most
             positions, so confidences tie exactly and torch.topk's CPU
             order among ties (implementation-defined; ours takes the lowest
             index) decides: the free-running agreement is an INFO line and
             the check is teacher-forced: every upstream reveal must be a
             top-k of our confidences on upstream's canvas, with our token.
             `origin` and `alg_temp` draw from torch's RNG, so for them
             each token upstream reveals is checked against our greedy
             prediction on upstream's own canvas of that step (teacher
             forced), and the per-step reveal counts against ours.
  loss       dllm's MDLM/Dream trainer `compute_loss` (torch.rand replaced
             for the call by injected draws, so t and the mask are known)
             vs `trm.families.dream.loss.shifted_masked_loss` on the same
             noisy batch, and the gradients of every weight. dllm divides
             by the number of maskable tokens, ours (DiffuCoder / DiffuLLaMA
             recipe, spec section 3.1) by the number of masked ones, and
             dllm weights 1/(t + 1e-6) where ours weights 1/t: the check
             rescales ours by n_masked / n_maskable and compares within a
             tolerance that covers the 1e-6; the raw ratio is printed.
  reference  benchmarks/reference/dream_torch_sampler.py (our spec-written
             port) vs upstream: logits and sampled tokens.
  draws      sampling at temperature > 0, which cannot match token for
             token (torch's and JAX's RNGs differ), compared by
             distribution: on random logits (vocab 300, rows with exact
             ties, ties at the top, near-ties ERR) for
             temperature 0.5/1.0/1.3 x top_p None/0.9/0.95 x top_k
             None/20, upstream's `sample_tokens` runs with
             torch.distributions.Categorical replaced by a stand-in that
             records the probabilities it is given and returns OUR token.
             Checked: the kept sets (upstream's probability > 0 vs
             `token_draws.token_probs`'s) and the probabilities (float32);
             the confidence ours returns for the tokens our `sample_tokens`
             drew against upstream's for the same tokens (maskgit_plus,
             topk_margin, entropy); and 2,000 draws per row (22,000 per
             setting) of ours against upstream's probabilities
             (common.draw_test: a chi-square test per row, false alarm <=
             1e-6 over the run). Exact ties cut by top-p are
             implementation-defined in upstream (torch.sort on CPU is not
             stable; ours keeps the lowest ids): such rows must keep the
             same number of tokens of the tied value, are compared as
             sorted probabilities, and are tested by tie class. Rows where
             top_p is within 1e-5 of a cumulative sum (float32 near-ties:
             1-ulp roundings decide) are counted, not compared.
  export     the other direction, a user's: our params (those read from
             upstream's save plus seeded N(0, 1) x 1e-2 noise on every
             weight, so no file of upstream's is read back) written by OUR
             exporter (`hf_import.export_hf_checkpoint`: tensors,
             config.json, generation_config.json) in float32 and in
             bfloat16 (`trm.export`'s default), each read by upstream's
             `DreamModel.from_pretrained`, its config by upstream's
             DreamConfig. Checked: every tensor of upstream's model equals
             the file's, dtype too, and transformers' loading info names
             nothing missing, unexpected or mismatched (taken from
             transformers' own PreTrainedModel.from_pretrained on the class:
             Dream's override sets generation_config on its result, so it
             cannot return the info); the only tensors not in the file are
             the non-persistent rotary inv_freq buffers, lm_head is not tied.
             The config.json fields upstream reads (EXPORT_FIELDS: sizes,
             RoPE, eps, tying, mask/pad/bos/eos ids, torch_dtype) equal
             those of upstream's own save, torch_dtype the export's (other
             keys that differ: an INFO line; our config.json writes bos and
             eos = pad_token_id, as Dream and DiffuCoder have them).
             Upstream's logits on the export vs ours (float32; bf16: bf16
             compute at TOL_BF16, and the stored weights in float32 against
             ours rounded to bf16 at TOL_LOGITS); greedy diffusion_generate
             (maskgit_plus; entropy, left-padded): final tokens equal. And
             trm.export's whole path: upstream's three files as the
             --tokenizer source's remote code, copied, `auto_map` added,
             read by `AutoModel.from_pretrained(trust_remote_code=True)`.
             A stage whose export or load raises is one FAIL line naming
             the error (every stage did, OSError, until our exporter wrote
             generation_config.json, which Dream's from_pretrained needs).

Each check prints one line in common.py's format: name, max abs diff, max
rel diff (relative to the larger side's max |value|) or "N of M differ" for
tokens, tolerance, PASS/FAIL (INFO: reported, not scored), a note.
Exits 1 if any check fails, 2 on a bad flag. `--perturb` adds 1e-3 to one
of OUR weights (layer 0's q_proj bias) after loading: checks must FAIL
(the draws check: ours applies the temperature twice; the export check:
ours moves again after the export, which upstream reads).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.abc
import importlib.machinery
import os
import shutil
import subprocess
import sys
import tempfile
import types

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # common.py beside this file
  sys.path.insert(0, _HERE)
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

MODEL_FILES = ("configuration_dream.py", "modeling_dream.py",
               "generation_utils.py")
TRAINER_FILES = ("dllm/core/trainers/mdlm.py", "dllm/pipelines/dream/trainer.py")
NESTED = "dllm/pipelines/dream/models"
CHECKS = ("forward", "sampling", "loss", "reference", "draws", "export")

# Float tolerances, relative to the larger side's max |value| (float32).
TOL_LOGITS = 1e-5
TOL_LOSS = 1e-5
TOL_GRAD = 1e-4
# bfloat16 compute: a few roundings of 2^-8 apart, relative to max |logit|.
TOL_BF16 = 3e-2


UsageError = common.UsageError


# ----------------------------------------------------------------- flags

@dataclasses.dataclass
class Options:
  upstream_dir: str = ""
  upstream_git: str = ""
  json: str = ""
  checks: tuple = CHECKS
  perturb: bool = False
  vocab: int = 1024
  hidden: int = 128
  layers: int = 2
  prompt_len: int = 16
  new_tokens: int = 32
  head_scale: float = 20.0
  seed: int = 0


def parse_args(argv) -> Options:
  """`--name=value` flags (and `--perturb`); raises UsageError naming the
  flag. Checks the upstream folder before any heavy import."""
  opts = common.read_flags(argv, Options(), CHECKS)
  if opts.hidden % 4 or (opts.hidden // 4) % 2:
    raise UsageError(f"--hidden={opts.hidden} must be a multiple of 8 "
                     "(4 heads, even head dim)")
  if min(opts.vocab, opts.layers, opts.prompt_len, opts.new_tokens) < 1 or (
      opts.vocab < 64):
    raise UsageError("--vocab (>= 64), --layers, --prompt_len and "
                     "--new_tokens must be positive")
  if not opts.upstream_dir:
    raise UsageError("--upstream_dir is required: a checkout of ZHZisZZ/dllm"
                     " (or a folder with Dream's modeling_dream.py)")
  model_dir(opts.upstream_dir)  # raises UsageError
  if opts.upstream_git and not os.path.isdir(opts.upstream_git):
    raise UsageError(f"--upstream_git={opts.upstream_git!r} is not a "
                     "directory")
  return opts


def model_dir(upstream_dir: str) -> str:
  """The folder holding upstream's three Dream model files."""
  if not os.path.isdir(upstream_dir):
    raise UsageError(f"--upstream_dir={upstream_dir!r} is not a directory")
  for folder in (os.path.join(upstream_dir, NESTED), upstream_dir):
    if all(os.path.isfile(os.path.join(folder, f)) for f in MODEL_FILES):
      return folder
  raise UsageError(
      f"--upstream_dir={upstream_dir!r} holds no Dream model code (neither "
      f"{NESTED}/ nor the folder itself has {', '.join(MODEL_FILES)})")


def has_trainer(upstream_dir: str) -> bool:
  return all(os.path.isfile(os.path.join(upstream_dir, f))
             for f in TRAINER_FILES)


# ------------------------------------------------------------ comparison

Check = common.Check


def compare_arrays(name: str, ours, theirs, tol: float, where=None) -> Check:
  """common.compare relative to the larger side's max |value|, only where
  `where` holds."""
  return common.compare(name, ours, theirs, tol, scale="larger", where=where)


def compare_tokens(name: str, ours, theirs, history=None) -> Check:
  """Exact token agreement (common.compare_exact). `history`, a pair of
  [steps, B, L] arrays, must be equal too: the note says the first step
  where they part."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  check = common.compare_exact(name, [(ours, theirs)])
  if history is not None:
    ha, hb = (np.asarray(h) for h in history)
    if ha.shape != hb.shape:
      first = -1
    else:
      parted = np.nonzero((ha != hb).reshape(ha.shape[0], -1).any(-1))[0]
      first = int(parted[0]) if len(parted) else None
    check.passed = check.passed and first is None
    check.add_note("history equal" if first is None else
                   f"history parts at step {first}")
    check.values["first_history_diff"] = first
  return check


def blob_id(path: str) -> str:
  """git's blob id of a file (sha1 of 'blob <size>\\0' + bytes)."""
  with open(path, "rb") as f:
    data = f.read()
  return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def perturb_params(params, amount: float = 1e-3):
  """Our params with `amount` added to layer 0's q_proj bias (`--perturb`)."""
  import jax  # pylint: disable=g-import-not-at-top
  out = jax.tree.map(lambda x: x, params)
  attn = out["layers"]["self_attn"] if "layers" in out else (
      out["layers_0"]["self_attn"])
  bias = attn["q_proj"]["bias"]
  attn["q_proj"]["bias"] = (bias.at[0].add(amount) if "layers" in out
                            else bias + amount)
  return out


# --------------------------------------------------------- upstream import

class _Stub(types.ModuleType):
  """A stand-in for a package that is not installed: lower-case attributes
  are sub-modules, capitalised ones empty classes (usable as bases)."""

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    if name[0].islower():
      value = _Stub(f"{self.__name__}.{name}")
      value.__path__ = []
    else:
      value = type(name, (), {"__init__": lambda self, *a, **k: None,
                              "__getattr__": lambda self, n: None})
    setattr(self, name, value)
    return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  def __init__(self, roots):
    self.roots = set(roots)

  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in self.roots:
      return importlib.machinery.ModuleSpec(name, self, is_package=True)
    return None

  def create_module(self, spec):
    module = _Stub(spec.name)
    module.__path__ = []
    return module

  def exec_module(self, module):
    pass


def _shim_missing(names) -> list[str]:
  """Registers stand-ins for those of `names` that are not installed."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  missing = [n for n in names if importlib.util.find_spec(n) is None]
  if missing:
    sys.meta_path.append(_StubFinder(missing))
  return missing


def import_upstream(upstream_dir: str):
  """(models module namespace, trainer modules or None, shimmed names).

  The dllm tree is put on sys.path; its heavy package `__init__`s are
  bypassed by registering the packages on the way to the modules used
  (dllm, dllm.core, dllm.utils, dllm.pipelines, dllm.pipelines.dream) as
  bare packages with their real folders, so only the needed files run."""
  os.environ.setdefault("USE_TF", "0")  # transformers: no TensorFlow
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  folder = model_dir(upstream_dir)
  shimmed = []
  nested = os.path.abspath(folder) != os.path.abspath(upstream_dir)
  if nested:
    root = os.path.abspath(upstream_dir)
    sys.path.insert(0, root)
    for pkg in ("dllm", "dllm.core", "dllm.utils", "dllm.pipelines",
                "dllm.pipelines.dream"):
      module = types.ModuleType(pkg)
      module.__path__ = [os.path.join(root, *pkg.split("."))]
      sys.modules[pkg] = module
    package = "dllm.pipelines.dream.models"
  else:
    package = "upstream_dream_models"
    module = types.ModuleType(package)
    module.__path__ = [os.path.abspath(folder)]
    sys.modules[package] = module
  import importlib  # pylint: disable=g-import-not-at-top
  models = types.SimpleNamespace(
      configuration=importlib.import_module(f"{package}.configuration_dream"),
      modeling=importlib.import_module(f"{package}.modeling_dream"),
      generation=importlib.import_module(f"{package}.generation_utils"))
  trainer = None
  if nested and has_trainer(upstream_dir):
    shimmed = _shim_missing(("accelerate", "peft", "datasets", "torchmetrics"))
    trainer = types.SimpleNamespace(
        mdlm=importlib.import_module("dllm.core.trainers.mdlm"),
        dream=importlib.import_module("dllm.pipelines.dream.trainer"),
        schedulers=importlib.import_module("dllm.core.schedulers"))
  return models, trainer, shimmed


def upstream_files(upstream_dir: str) -> dict[str, str]:
  """{path relative to upstream_dir: git blob id} of the files used."""
  folder = model_dir(upstream_dir)
  paths = [os.path.join(folder, f) for f in MODEL_FILES]
  if os.path.abspath(folder) != os.path.abspath(upstream_dir) and has_trainer(
      upstream_dir):
    paths += [os.path.join(upstream_dir, f) for f in TRAINER_FILES]
  return {os.path.relpath(p, upstream_dir): blob_id(p) for p in paths}


def upstream_commit(opts: Options, files: dict[str, str]) -> str:
  """The commit: `git rev-parse HEAD` of the checkout if it is one (and
  clean for these files), else of --upstream_git when every file's blob id
  equals the one in that commit's tree under the nested path."""
  def git(*args, cwd=None):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True,
                          text=True, check=False)
  head = git("rev-parse", "HEAD", cwd=opts.upstream_dir)
  if head.returncode == 0 and not git(
      "status", "--porcelain", "--", *files, cwd=opts.upstream_dir).stdout:
    return head.stdout.strip()
  if opts.upstream_git:
    prefix = "" if NESTED.split("/")[0] in next(iter(files)) else NESTED + "/"

    def matches(commit):
      return all(git("--git-dir", opts.upstream_git, "rev-parse",
                     f"{commit}:{prefix}{path}").stdout.strip() == blob
                 for path, blob in files.items())
    head = git("--git-dir", opts.upstream_git, "rev-parse",
               "HEAD").stdout.strip()
    if matches(head):
      return head + " (HEAD of --upstream_git; file contents match its tree)"
    # An older snapshot (e.g. the three model files pinned at a commit):
    # the newest commit touching them whose tree holds these contents.
    touching = git("--git-dir", opts.upstream_git, "rev-list", "HEAD", "--",
                   *[prefix + p for p in files]).stdout.split()
    for commit in touching:
      if matches(commit):
        return commit + " (file contents match its tree; not HEAD)"
    return f"unknown (files match no commit of {opts.upstream_git})"
  return "unknown (not a git work tree; pass --upstream_git)"


# ------------------------------------------------------------------ checks

def build_checkpoint(up, opts: Options, directory: str):
  """Upstream's DreamModel, every weight random, LM head scaled, saved with
  save_pretrained; returns upstream's model read back from `directory`."""
  import torch  # pylint: disable=g-import-not-at-top
  cfg = up.configuration.DreamConfig(
      vocab_size=opts.vocab, hidden_size=opts.hidden,
      intermediate_size=2 * opts.hidden, num_hidden_layers=opts.layers,
      num_attention_heads=4, num_key_value_heads=2, rope_theta=1e6,
      rms_norm_eps=1e-6, max_position_embeddings=4096,
      mask_token_id=opts.vocab - 1, pad_token_id=0, bos_token_id=0,
      eos_token_id=0, tie_word_embeddings=False, torch_dtype="float32")
  torch.manual_seed(opts.seed)
  model = up.modeling.DreamModel(cfg)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.05 * torch.randn_like(p))
      else:
        p.copy_(0.05 * torch.randn_like(p))
    model.lm_head.weight.mul_(opts.head_scale)
  model.save_pretrained(directory, safe_serialization=True)
  loaded = up.modeling.DreamModel.from_pretrained(
      directory, torch_dtype=torch.float32)
  # Upstream's from_pretrained returns no loading info: check it read every
  # weight back as written.
  want, got = model.state_dict(), loaded.state_dict()
  if set(want) != set(got) or any(not torch.equal(want[k], got[k])
                                  for k in want):
    raise RuntimeError("upstream from_pretrained did not read back the "
                       "weights save_pretrained wrote")
  return loaded.eval()


def left_padded(ids, pads):
  """(ids with `pads[b]` leading pad tokens (id 0), 2-D mask)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  ids = np.array(ids)
  mask = np.ones_like(ids)
  for row, n in enumerate(pads):
    ids[row, :n] = 0
    mask[row, :n] = 0
  return ids, mask


def positions_of(mask):
  import numpy as np  # pylint: disable=g-import-not-at-top
  pos = np.cumsum(mask, -1) - 1
  return np.where(mask == 1, pos, 1)


class Ours:
  """Our model, params and sampler on the checkpoint directory."""

  def __init__(self, directory: str, perturb: bool):
    import jax  # pylint: disable=g-import-not-at-top
    from trm.families.dream import hf_config  # pylint: disable=g-import-not-at-top
    from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top
    from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
    cfg, _ = hf_config.model_config_from_hf(directory, dtype="float32",
                                            param_dtype="float32")
    self.cfg = cfg
    self.dream = dream
    self.params = hf_import.load_hf_checkpoint(directory, cfg)
    if perturb:
      self.params = perturb_params(self.params)
    self.model = dream.Dream(cfg)
    self.denoiser = dream.denoiser(cfg)
    self._apply = {
        dtype: jax.jit(lambda p, x, m, pos, model=dream.Dream(
            dataclasses.replace(cfg, dtype=dtype)): model.apply(
                {"params": p}, x, m, pos))
        for dtype in ("float32", "bfloat16")}

  def logits(self, ids, mask=None, positions=None, dtype="float32",
             params=None):
    """Raw logits (float32 params, ours unless `params`; compute in
    `dtype`)."""
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    return np.asarray(self._apply[dtype](
        self.params if params is None else params,
        jnp.asarray(ids, jnp.int32),
        None if mask is None else jnp.asarray(mask, bool),
        None if positions is None else jnp.asarray(positions, jnp.int32)))

  def generate(self, ids, mask, params=None, **kw):
    import numpy as np  # pylint: disable=g-import-not-at-top
    from trm.families.dream import sampling  # pylint: disable=g-import-not-at-top
    seq, hist = sampling.diffusion_generate(
        self.denoiser, ids, mask,
        params=self.params if params is None else params,
        mask_token_id=self.cfg.mask_token_id, return_history=True, **kw)
    return np.asarray(seq), np.asarray(hist)


def shift(logits):
  import numpy as np  # pylint: disable=g-import-not-at-top
  return np.concatenate([logits[:, :1], logits[:, :-1]], axis=1)


def check_forward(up_model, ours: Ours, opts: Options, rng) -> list[Check]:
  import torch  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  out = []
  length = opts.prompt_len + opts.new_tokens
  ids = rng.integers(1, opts.vocab - 1, (3, length))
  ids[:, -opts.new_tokens // 2:] = opts.vocab - 1  # some mask tokens
  with torch.no_grad():
    theirs = up_model(torch.as_tensor(ids)).logits.numpy()
  mine = ours.logits(ids)
  out.append(compare_arrays("forward: logits, full attention", mine, theirs,
                            TOL_LOGITS))
  out.append(compare_arrays("forward: shifted logits (sampler view)",
                            shift(mine), shift(theirs), TOL_LOGITS))
  # A left-padded batch: upstream's 4-D boolean pair mask + tok_idx.
  pids, mask = left_padded(ids, [0, 3, 7])
  pos = positions_of(mask)
  m = torch.as_tensor(mask).bool()
  mask4 = m[:, None, None, :] & m[:, None, :, None]
  with torch.no_grad():
    theirs = up_model(torch.as_tensor(pids), mask4,
                      torch.as_tensor(pos)).logits.numpy()
  mine = ours.logits(pids, mask, pos)
  real = np.broadcast_to(mask.astype(bool)[..., None], mine.shape)
  out.append(compare_arrays("forward: logits, left-padded (real positions)",
                            mine, theirs, TOL_LOGITS, where=real))
  # The unpadded rows' real positions must not change with padding.
  unpadded = ours.logits(ids[2:, 7:])
  out.append(compare_arrays("forward: padded row == unpadded (ours)",
                            mine[2, 7:], unpadded[0], TOL_LOGITS))
  # bfloat16 compute on both sides (upstream: the model cast to bf16, as
  # the hub's torch_dtype; ours: dtype=bfloat16). Rounding points inside
  # torch's CPU SDPA kernel differ from ours, so the tolerance is bf16's;
  # upstream's own fp32-vs-bf16 distance is printed for scale.
  import copy  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    ref32 = up_model(torch.as_tensor(ids)).logits.numpy()
    theirs = copy.deepcopy(up_model).to(torch.bfloat16)(
        torch.as_tensor(ids)).logits.float().numpy()
  mine = ours.logits(ids, dtype="bfloat16").astype(np.float32)
  check = compare_arrays("forward: logits, bfloat16 compute", mine, theirs,
                         TOL_BF16)
  own = float(np.abs(ref32 - theirs).max() / np.abs(ref32).max())
  agree = float(np.mean(mine.argmax(-1) == theirs.argmax(-1)))
  check.add_note(f"upstream fp32 vs its bf16: max_rel {own:.3e};"
                 f" argmax agree {100 * agree:.1f}%")
  out.append(check)
  return out


def upstream_generate(up, up_model, ids, mask, **kw):
  """sequences [B, L], history [steps, B, L] from diffusion_generate."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  gen_cfg = up.generation.DreamGenerationConfig(
      mask_token_id=up_model.config.mask_token_id,
      pad_token_id=up_model.config.pad_token_id,
      bos_token_id=up_model.config.bos_token_id,
      eos_token_id=up_model.config.eos_token_id,
      output_history=True, return_dict=True, return_dict_in_generate=True,
      **kw)
  res = up_model.diffusion_generate(
      torch.as_tensor(ids), generation_config=gen_cfg,
      attention_mask=None if mask is None else torch.as_tensor(mask))
  return (res.sequences.numpy(),
          np.stack([h.numpy() for h in res.history]))


def teacher_forced(ours: Ours, start, hist, mask, mask_id, pos):
  """(our greedy tokens, upstream's tokens, reveal counts per step) at every
  position upstream reveals, each from our shifted logits on upstream's
  canvas before that step."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  mine, theirs, counts = [], [], []
  before = start
  for after in hist:
    new = (before == mask_id) & (after != mask_id)
    counts.append(new.sum(-1))
    pred = shift(ours.logits(before, mask, pos)).argmax(-1)
    mine.append(pred[new])
    theirs.append(after[new])
    before = after
  return (np.concatenate(mine), np.concatenate(theirs),
          np.stack(counts))


def valid_reveals(ours: Ours, start, hist, mask_id, *, alg, top_k, top_p,
                  steps):
  """Teacher-forced check of a confidence algorithm that tolerates exact
  ties: at every upstream step, each revealed position's token must be our
  greedy x0 there and its confidence (ours, on upstream's canvas before the
  step) must be >= our k-th largest over the masked positions, with k our
  schedule's count. Returns (bad reveals, reveals, tied steps)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trm.families.dream import reveal_rules  # pylint: disable=g-import-not-at-top
  from trm.families.dream import token_draws  # pylint: disable=g-import-not-at-top
  n = start.shape[1] - int((start != mask_id).sum(-1).min())
  schedule = reveal_rules.reveal_schedule(steps, n)
  bad = total = tied = 0
  before = start
  for i, after in enumerate(hist):
    masked = before == mask_id
    logits = shift(ours.logits(before))
    conf, x0 = token_draws.sample_tokens(
        jnp.asarray(logits), jax.random.key(0), temperature=0.0, top_p=top_p,
        top_k=top_k, conf_kind=alg)
    conf, x0 = np.asarray(conf), np.asarray(x0)
    new = masked & (after != mask_id)
    for row in range(before.shape[0]):
      k = schedule[i]
      total += int(new[row].sum())
      if int(new[row].sum()) != k:
        bad += abs(int(new[row].sum()) - k)
        continue
      if k == 0:
        continue
      c = np.where(masked[row], conf[row], -np.inf)
      kth = np.sort(c)[::-1][k - 1]
      tied += int((c == kth).sum() > np.sum(np.sort(c)[::-1][:k] == kth))
      bad += int(np.sum(new[row] & (c < kth)))
      bad += int(np.sum(new[row] & (x0[row] != after[row])))
    before = after
  return bad, total, tied


def check_sampling(up, up_model, ours: Ours, opts: Options, rng,
                   port=None, port_model=None) -> list[Check]:
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from trm.families.dream import reveal_rules  # pylint: disable=g-import-not-at-top
  out = []
  n = opts.new_tokens
  mask_id = opts.vocab - 1
  ids = rng.integers(1, mask_id, (2, opts.prompt_len))
  pids, pmask = left_padded(ids, [0, 5])
  start = np.concatenate([ids, np.full((2, n), mask_id)], axis=1)
  # (alg, steps, top_k, top_p, left-padded batch)
  settings = [(alg, steps, None, None, False)
              for alg in ("maskgit_plus", "topk_margin", "entropy")
              for steps in (n, n // 4)]
  settings += [("entropy", n // 2, 20, None, True),
               ("maskgit_plus", n, None, None, True),
               ("entropy", n // 2, 50, 0.95, False)]
  for alg, steps, top_k, top_p, padded in settings:
    x, m = (pids, pmask) if padded else (ids, None)
    kw = dict(max_new_tokens=n, steps=steps, alg=alg, temperature=0.0,
              top_k=top_k, top_p=top_p)
    theirs, their_hist = upstream_generate(up, up_model, x, m, **kw)
    mine, my_hist = ours.generate(x, m, **kw)
    name = (f"sample: {alg} {n} new/{steps} steps"
            + (f" top_k={top_k}" if top_k else "")
            + (f" top_p={top_p}" if top_p else "")
            + (" padded" if padded else ""))
    free = compare_tokens(name, mine[:, -n:], theirs[:, -n:],
                          (my_hist, their_hist))
    if top_p:
      # top-p leaves one token at most positions of this peaked model:
      # confidence exactly 1 (or neg. entropy exactly 0) ties, and
      # torch.topk's CPU order among ties is its own (ours: lowest index).
      free.info = True
      out.append(free)
      bad, total, tied = valid_reveals(ours, start, their_hist, mask_id,
                                       alg=alg, top_k=top_k, top_p=top_p,
                                       steps=steps)
      out.append(Check(
          name.replace("sample:", "teacher-forced reveals:"), bad == 0,
          figures=f"{bad} of {total} reveals bad",
          note=f"bad: not a top-k of our confidences or not our token; "
          f"{tied} steps with ties at the k-th",
          values={"bad": bad, "total": total, "tied_steps": tied}))
    else:
      out.append(free)
    if port is not None:
      ref = port.diffusion_generate(port_model, x, m, mask_token_id=mask_id,
                                    **kw)
      out.append(compare_tokens(name.replace("sample:", "port vs upstream:"),
                                ref[:, -n:], theirs[:, -n:]))
  # RNG-drawn reveals: teacher-forced token check and the reveal counts.
  for alg, alg_temp, steps in (("origin", None, n), ("origin", None, n // 4),
                               ("entropy", 0.5, n // 2),
                               ("maskgit_plus", 1.0, n)):
    torch.manual_seed(opts.seed)
    kw = dict(max_new_tokens=n, steps=steps, alg=alg, alg_temp=alg_temp,
              temperature=0.0, top_k=None, top_p=None)
    _, their_hist = upstream_generate(up, up_model, ids, None, **kw)
    mine, theirs, counts = teacher_forced(ours, start, their_hist, None,
                                          mask_id, None)
    label = f"{alg}" + (f" alg_temp={alg_temp}" if alg_temp else "")
    out.append(compare_tokens(
        f"teacher-forced: {label} {n} new/{steps} steps", mine, theirs))
    if alg != "origin":
      want = np.array(reveal_rules.reveal_schedule(steps, n))
      out.append(compare_tokens(f"reveal counts: {label} {steps} steps",
                                np.broadcast_to(want[:, None], counts.shape),
                                counts))
  return out


DRAW_VOCAB = 300
DRAW_N = 2000  # per row: 22,000 per setting
DRAW_ALPHA = 1e-6
TOL_PROBS = 1e-6  # float32 softmax, relative to the row's largest prob
NEAR_TIE = 1e-5  # float32 sums of 300 probabilities: a few 1e-7 apart


def draw_logits(rng, vocab: int = DRAW_VOCAB):
  """[R, V] float32 logits for the draws check: plain random rows, a tie
  among the top entries, integer-rounded rows (many exact ties everywhere,
  also at the top-p boundary), and rows whose sorted mass reaches 0.9 /
  0.95 exactly at temperature 1 (near-ties of the cumulative sum at the
  top-p threshold), plus a row of near-equal logits (1e-6 apart)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rows = [rng.normal(0, 2.0, vocab) for _ in range(3)]
  tie_top = rng.normal(0, 2.0, vocab)
  tie_top[10:20] = tie_top.max() + 0.5
  rows += [tie_top, np.round(rng.normal(0, 2.0, vocab)),
           np.round(rng.normal(0, 1.0, vocab) * 2) / 2]
  for head in ([0.45, 0.45], [0.5, 0.3, 0.15], [0.6, 0.3],
               [0.35, 0.35, 0.25]):
    rest = (1 - sum(head)) * rng.dirichlet(np.ones(vocab - len(head)))
    rows.append(np.log(np.concatenate([head, rest])))
  near = 3.0 + 1e-6 * rng.integers(0, 5, vocab)
  near[: vocab // 2] = rng.normal(-2, 1, vocab // 2)
  rows.append(near)
  return np.stack(rows).astype(np.float32)


class _Capture:
  """Stands in for torch.distributions inside upstream's generation_utils:
  `Categorical(probs=...)` records the probabilities and `.sample()`
  returns the token set in `token` (ours)."""

  def __init__(self):
    self.probs = None
    self.token = None
    capture = self

    class Categorical:  # pylint: disable=too-few-public-methods
      def __init__(self, probs=None, logits=None):
        del logits
        capture.probs = probs.detach().clone()

      def sample(self):
        return capture.token
    self.Categorical = Categorical  # pylint: disable=invalid-name


def near_tie_rows(scaled, top_p):
  """Rows where top_p lies within NEAR_TIE of a cumulative sum of the
  descending float64 probabilities: there 1-ulp roundings of either side's
  float32 sums decide whether the next token is kept (and ours may decide
  differently for another batch shape)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  if top_p is None:
    return []
  x = scaled.astype(np.float64)
  p = np.exp(x - x.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  cum = np.cumsum(-np.sort(-p, -1), -1)
  return [int(r) for r in np.nonzero(
      (np.abs(cum - top_p) <= NEAR_TIE).any(-1))[0]]


def classify_rows(scaled, ours, theirs, top_p):
  """Rows whose kept sets differ, as (split, bad): `split`, an exact tie
  cut by top-p (every differing token has one logit value and both keep as
  many tokens of it: which ones is torch.sort's order upstream, lowest ids
  ours); `bad`, any other difference outside `near_tie_rows`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  kept_a, kept_b = ours > 0, theirs > 0
  near = near_tie_rows(scaled, top_p)
  split, bad = [], []
  for r in np.nonzero((kept_a != kept_b).any(-1))[0]:
    if r in near:
      continue
    diff = kept_a[r] != kept_b[r]
    row = scaled[r]
    values = np.unique(row[diff])
    if values.size == 1 and (
        (kept_a[r] & (row == values[0])).sum()
        == (kept_b[r] & (row == values[0])).sum()):
      split.append(int(r))
    else:
      bad.append(int(r))
  return split, bad


def tie_classes(logits, draws, probs):
  """(draws, probs) with each token replaced by the first id of its logit
  value: tied tokens pooled into one bin."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  _, first, inverse = np.unique(logits, return_index=True,
                                return_inverse=True)
  ids = first[inverse.ravel()]
  pooled = np.zeros_like(probs)
  np.add.at(pooled, ids, probs)
  return ids[draws], pooled


def check_draws(up, opts: Options, rng) -> list[Check]:
  """Sampling at temperature > 0 by distribution (see `draws` above)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from trm.families.dream import token_draws  # pylint: disable=g-import-not-at-top
  logits = draw_logits(rng)
  rows, vocab = logits.shape
  settings = [(t, p, k) for t in (0.5, 1.0, 1.3) for p in (None, 0.9, 0.95)
              for k in (None, 20)]
  capture = _Capture()
  real = up.generation.dists
  up.generation.dists = capture
  kinds = {"maskgit_plus": {}, "topk_margin": {"margin_confidence": True},
           "entropy": {"neg_entropy": True}}
  set_bad = set_total = n_near = 0
  splits, prob_items, conf_items, all_draws, all_probs = [], [], [], [], []
  draw_labels = []
  try:
    for n_setting, (temp, top_p, top_k) in enumerate(settings):
      kw = dict(temperature=temp, top_p=top_p, top_k=top_k)
      ours = np.asarray(token_draws.token_probs(jnp.asarray(logits), **kw))
      if opts.perturb:  # the self-test: temperature applied twice
        ours = np.asarray(token_draws.token_probs(
            jnp.asarray(logits / np.float32(temp)), **kw))
      confs = {}
      for kind, flags in kinds.items():
        conf, x0 = token_draws.sample_tokens(
            jnp.asarray(logits), jax.random.key(n_setting),
            conf_kind=kind, **kw)
        capture.token = torch.as_tensor(np.array(x0), dtype=torch.long)
        up_conf, up_x0 = up.generation.sample_tokens(
            torch.as_tensor(logits), **kw, **flags)
        if not torch.equal(up_x0, capture.token):
          raise RuntimeError("upstream's sample_tokens did not take the "
                             "stand-in Categorical's token")
        confs[kind] = (np.asarray(conf), up_conf.numpy())
      theirs = capture.probs.numpy()
      split, bad = classify_rows(logits / np.float32(temp), ours, theirs,
                                 top_p)
      near = near_tie_rows(logits / np.float32(temp), top_p)
      set_total += rows - len(near)
      set_bad += len(bad)
      n_near += len(near)
      splits.append(len(split))
      label = f"T={temp} top_p={top_p} top_k={top_k}"
      plain = np.setdiff1d(np.arange(rows), split + near + bad)
      prob_items.append((label, ours[plain], theirs[plain],
                         np.broadcast_to(theirs[plain].max(-1, keepdims=True),
                                         theirs[plain].shape)))
      if split:
        prob_items.append((label + " split ties (sorted)",
                           -np.sort(-ours[split], -1),
                           -np.sort(-theirs[split], -1),
                           np.broadcast_to(theirs[split].max(-1,
                                                             keepdims=True),
                                           theirs[split].shape)))
      for kind, (a, b) in confs.items():
        conf_items.append((f"{kind} {label}", a[plain], b[plain], "larger"))
      # Draws: DRAW_N per row, one vectorised call.
      tiled = jnp.asarray(np.repeat(logits, DRAW_N, axis=0))
      if opts.perturb:
        tiled = tiled / jnp.float32(temp)
      _, x0 = token_draws.sample_tokens(
          tiled, jax.random.key(1000 + n_setting), conf_kind="maskgit_plus",
          **kw)
      draws = np.asarray(x0).reshape(rows, DRAW_N)
      for r in range(rows):
        if r in near or r in bad:
          continue
        d, p = draws[r], theirs[r]
        if r in split:
          d, p = tie_classes(logits[r] / np.float32(temp), d, p)
        all_draws.append(d)
        draw_labels.append(f"{label} row {r}")
        all_probs.append(p)
  finally:
    up.generation.dists = real
  n_split = sum(splits)
  out = [Check(f"draws: kept sets, {len(settings)} settings x {rows} rows",
               set_bad == 0, figures=f"{set_bad} of {set_total} rows differ",
               note=f"{n_split} rows with an exact tie cut by top-p (same "
               "count kept of the tied value; which ones: torch.sort's "
               f"order); {n_near} rows with a float32 near-tie of the mass "
               f"at top_p (within {NEAR_TIE:g}): not compared here or "
               "below",
               values={"bad": set_bad, "total": set_total,
                       "split_ties": n_split, "near_ties": n_near})]
  out.append(common.compare_all(
      f"draws: probabilities after filters ({len(settings)} settings)",
      [(lbl, a, b, s) for lbl, a, b, s in prob_items], TOL_PROBS))
  out.append(common.compare_all(
      "draws: confidence of our drawn token (3 kinds)", conf_items,
      TOL_PROBS))
  test = common.draw_test(
      f"draws: ours vs upstream's probs, {DRAW_N} per row",
      np.stack(all_draws), np.stack(all_probs), alpha=DRAW_ALPHA,
      tests=len(all_draws),
      note=f"{len(settings)} settings x {rows} rows less near-ties")
  if test.values["failed_rows"]:
    test.add_note("failing: " + ", ".join(
        draw_labels[i] for i in test.values["failed_rows"][:4]))
  out.append(test)
  return out


def check_loss(trainer, up_model, ours: Ours, opts: Options,
               rng) -> list[Check]:
  """dllm's compute_loss with injected draws vs ours, loss and gradients."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_layout  # pylint: disable=g-import-not-at-top
  from trm.families.dream import loss as diffusion_loss  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  mask_id = opts.vocab - 1
  b, length = 4, opts.prompt_len + opts.new_tokens
  tokens = rng.integers(1, mask_id, (b, length))
  prompt = np.array([3, 5, 8, opts.prompt_len])[:, None]
  maskable = np.arange(length)[None, :] >= prompt  # position 0 never
  t_rand = torch.tensor(rng.uniform(0.25, 1.0, b), dtype=torch.float32)
  eps = 1e-3
  t = (eps + (1 - eps) * t_rand).numpy()  # as dllm computes it (float32)
  u = torch.tensor(rng.uniform(0, 1, (b, length)), dtype=torch.float32)
  draws = [t_rand, u]

  class Meter:
    def update(self, **kwargs):
      self.kwargs = kwargs

  def run(weight_type):
    obj = object.__new__(trainer.dream.DreamTrainer)
    obj.__dict__.update(
        processing_class=types.SimpleNamespace(
            padding_side="right", mask_token_id=mask_id, bos_token_id=0),
        scheduler=trainer.schedulers.LinearAlphaScheduler(),
        time_epsilon=eps, loss_weight_type=weight_type,
        loss_norm_type="token", right_shift_logits=True, meter=Meter())
    labels = torch.where(torch.as_tensor(maskable), torch.as_tensor(tokens),
                         torch.tensor(-100))
    inputs = {"input_ids": torch.as_tensor(tokens), "labels": labels}
    queue = list(draws)
    real_rand = torch.rand
    torch.rand = lambda *a, **k: queue.pop(0)  # the two draws, in order
    try:
      up_model.zero_grad()
      loss = obj.compute_loss(up_model, inputs)
    finally:
      torch.rand = real_rand
    if queue:
      raise RuntimeError("dllm's compute_loss drew fewer numbers than "
                         "expected")
    return loss
  loss_up = run("scheduler")
  loss_up.backward()
  loss_up = float(loss_up.detach())
  grads_up = {k: p.grad.numpy().copy() for k, p in up_model.named_parameters()}
  masked = (u.numpy() < t[:, None]) & maskable
  noisy = np.where(masked, mask_id, tokens)
  n_masked, n_maskable = int(masked[:, 1:].sum()), int(maskable.sum())

  def our_loss(params):
    variables = {"params": params}
    hidden = ours.model.apply(variables, jnp.asarray(noisy), method="hidden")
    loss, count = diffusion_loss.shifted_masked_loss(
        hidden, dream.head_kernel(params),
        lambda h, table: dream.head_logits(h, table, ours.model.cfg),
        jnp.asarray(tokens), jnp.asarray(masked), jnp.asarray(t),
        chunk_size=16,
        gather_fn=lambda k: dream.gather_head(k, ours.model.cfg))
    return loss, count
  (loss_ours, count), grads = jax.value_and_grad(our_loss, has_aux=True)(
      ours.params)
  rescale = n_masked / n_maskable
  out = [Check("loss: masked tokens (ours == dllm's mask)",
               int(count) == n_masked,
               figures=f"ours {int(count)} dllm {n_masked}",
               note=f"of {n_maskable} maskable")]
  # dllm weights 1/(t + 1e-6): a relative 1e-6 / min(t) on top of float32.
  tol = TOL_LOSS + 1e-6 / float(t.min())
  check = compare_arrays("loss: dllm scheduler/token vs ours*masked/maskable",
                         float(loss_ours) * rescale, float(loss_up), tol)
  check.add_note(f"ours {float(loss_ours):.6f}, dllm {float(loss_up):.6f}, "
                 f"ratio {float(loss_ours) / float(loss_up):.4f} = "
                 f"maskable/masked {n_maskable}/{n_masked}")
  out.append(check)
  # Gradients, ours mapped to the HF layout, every tensor.
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  per_tensor = []
  for leaf in hf_layout.leaves(ours.cfg):
    value = np.asarray(weights_io.get_path(grads, leaf.path)) * rescale
    items = ([(leaf.hf_name.replace("{i}", str(i)), value[i])
              for i in range(value.shape[0])] if leaf.per_layer
             else [(leaf.hf_name, value)])
    per_tensor += [(name, hf_layout.to_hf(leaf, g), grads_up[name], "larger")
                   for name, g in items]
  out.append(common.compare_all(
      f"loss: gradients, {len(per_tensor)} tensors (worst)", per_tensor,
      TOL_GRAD))
  # CART, the Dream trainer's default weighting: ours has none; report.
  loss_cart = float(run("cart[geo_p:0.3]").detach())
  out.append(Check("loss: dllm CART weighting (not in ours)", True,
                   figures=f"{loss_cart:.6f} vs 1/t {float(loss_up):.6f}",
                   note="dllm's CART loss, not compared", info=True,
                   values={"cart": loss_cart}))
  return out


def check_reference_forward(port_model, up_model, opts: Options,
                            rng) -> list[Check]:
  import torch  # pylint: disable=g-import-not-at-top
  length = opts.prompt_len + opts.new_tokens
  ids = torch.as_tensor(rng.integers(1, opts.vocab - 1, (2, length)))
  full = torch.ones(2, 1, length, length, dtype=torch.bool)
  with torch.no_grad():
    mine = port_model(input_ids=ids, attention_mask=full).logits.numpy()
    theirs = up_model(ids).logits.numpy()
  return [compare_arrays("port vs upstream: logits (Qwen2 + 4-D mask)",
                         mine, theirs, TOL_LOGITS)]


# ---------------------------------------------------------------- export

# config.json fields upstream's DreamConfig and DreamModel read: sizes,
# RoPE, norm, attention switches, head tying, the special ids
# diffusion_generate takes from the model's config, the stored dtype.
EXPORT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size",
                 "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "rope_theta", "rope_scaling",
                 "rms_norm_eps", "hidden_act", "use_sliding_window",
                 "sliding_window", "attention_dropout",
                 "tie_word_embeddings", "mask_token_id", "pad_token_id",
                 "bos_token_id", "eos_token_id", "torch_dtype")
EXPORT_NOISE = 1e-2  # N(0, 1) times this on every weight before export


def noised(params, seed: int, amount: float = EXPORT_NOISE):
  """`params` plus `amount` * N(0, 1) (numpy, seeded) on every weight:
  values no file of upstream's holds."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: x + np.float32(amount) * rng.standard_normal(
      x.shape, np.float32), params)


def bf16_rounded(params):
  """`params` rounded to bfloat16 (kept float32): what a bf16 export
  stores."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32),
                      params)


def export_ours(ours: Ours, params, directory: str, dtype: str,
                source: str | None = None) -> None:
  """`params` written by OUR exporter (hf_import.export_hf_checkpoint,
  config.json included); with `source`, then as `python -m trm.export
  --tokenizer=source` goes on: its files copied, `auto_map` added."""
  from trm import export  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top
  hf_import.export_hf_checkpoint(params, ours.cfg, directory, dtype=dtype)
  if source:
    copied = export.copy_tokenizer_files(source, directory)
    if not export.link_remote_code(directory, copied):
      raise RuntimeError(f"trm.export named no remote code for {directory}"
                         f" (copied {copied})")


def load_export(up, directory: str, dtype):
  """(upstream's model on our export, its loading info). The model comes
  from DreamModel.from_pretrained, the user's call; that override sets
  `generation_config` on what transformers returns, so it cannot take
  output_loading_info=True: the info comes from transformers' own
  PreTrainedModel.from_pretrained on the same class and directory."""
  import transformers  # pylint: disable=g-import-not-at-top
  cls = up.modeling.DreamModel
  model = cls.from_pretrained(directory, torch_dtype=dtype)
  _, info = transformers.PreTrainedModel.from_pretrained.__func__(
      cls, directory, torch_dtype=dtype, output_loading_info=True)
  return model.eval(), info


def load_auto(directory: str):
  """`AutoModel.from_pretrained(directory, trust_remote_code=True)`, the
  remote code copied into transformers' module cache under `directory`'s
  parent (not the user's ~/.cache)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from transformers import dynamic_module_utils  # pylint: disable=g-import-not-at-top
  real = dynamic_module_utils.HF_MODULES_CACHE
  dynamic_module_utils.HF_MODULES_CACHE = os.path.join(
      os.path.dirname(directory), "hf_modules")
  try:
    return transformers.AutoModel.from_pretrained(
        directory, trust_remote_code=True, torch_dtype=torch.float32).eval()
  finally:
    dynamic_module_utils.HF_MODULES_CACHE = real


def read_from_file(name: str, model, info, directory: str) -> Check:
  """Every tensor of upstream's model equals the file's (dtype too), the
  file has none it left unread, transformers reports no key missing,
  unexpected or mismatched; the head is not tied to the embeddings and
  the only tensors not in the file are non-persistent rotary buffers."""
  import torch  # pylint: disable=g-import-not-at-top
  from safetensors.torch import load_file  # pylint: disable=g-import-not-at-top
  stored = {}
  for file in sorted(os.listdir(directory)):
    if file.endswith(".safetensors"):
      stored.update(load_file(os.path.join(directory, file)))
  state = model.state_dict()
  differ = [k for k, v in state.items() if k not in stored or (
      v.dtype != stored[k].dtype or v.shape != stored[k].shape
      or not torch.equal(v, stored[k]))]
  unread = sorted(set(stored) - set(state))
  reported = {k: list(info.get(k) or ()) for k in
              ("missing_keys", "unexpected_keys", "mismatched_keys")}
  buffers = sorted({n for n, _ in model.named_buffers()} - set(state))
  others = [n for n in buffers if not n.endswith("inv_freq")]
  tied = (model.get_output_embeddings().weight.data_ptr()
          == model.get_input_embeddings().weight.data_ptr())
  bad = differ + unread + others + sum(reported.values(), [])
  check = Check(name, not bad and not tied,
                figures=f"{len(differ)} of {len(state)} differ, "
                f"{sum(map(len, reported.values()))} reported",
                note=f"{len(buffers)} rotary inv_freq buffers (not "
                "persistent: from rope_theta); lm_head "
                + ("TIED to the embeddings" if tied else "its own tensor"),
                values={"differ": differ, "unread": unread,
                        "unfiled_buffers": buffers, "tied": tied,
                        **reported})
  for label, names in [("differ", differ), ("unread in the file", unread),
                       ("buffers not in the file", others)] + list(
                           reported.items()):
    if names:
      check.add_note(f"{label}: {', '.join(map(str, names[:3]))}"
                     + (" ..." if len(names) > 3 else ""))
  return check


def config_round_trip(up, source, directory: str, dtype: str) -> list[Check]:
  """upstream's DreamConfig on our config.json against the config it wrote
  itself (the checkpoint we read): EXPORT_FIELDS equal (torch_dtype: the
  export's), and an INFO line naming every other key that differs."""
  exported = up.configuration.DreamConfig.from_pretrained(directory)
  want = {f: getattr(source, f, None) for f in EXPORT_FIELDS}
  want["torch_dtype"] = dtype
  got = {f: getattr(exported, f, None) for f in EXPORT_FIELDS}
  got["torch_dtype"] = str(got["torch_dtype"]).replace("torch.", "")
  wrong = [f"{f}: {want[f]!r} -> {got[f]!r}" for f in EXPORT_FIELDS
           if got[f] != want[f]]
  a, b = source.to_dict(), exported.to_dict()
  skip = EXPORT_FIELDS + ("dtype", "transformers_version", "_name_or_path")
  other = sorted(k for k in set(a) | set(b)
                 if k not in skip and a.get(k) != b.get(k))
  return [Check(f"export {dtype}: config.json, fields upstream reads",
                not wrong, figures=f"{len(wrong)} of {len(EXPORT_FIELDS)} "
                "differ", note="; ".join(wrong[:4]),
                values={"wrong": wrong}),
          Check(f"export {dtype}: config.json, other keys", True,
                figures=f"{len(other)} differ", info=True,
                note=", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}"
                               for k in other),
                values={"other": other})]


def export_float32(up, up_model, ours: Ours, opts: Options, ids, rng, mine,
                   path) -> list[Check]:
  """float32 export: tensors, config, logits, greedy sampling."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  model, info = load_export(up, path, torch.float32)
  out = [read_from_file("export float32: every tensor read from the file",
                        model, info, path)]
  out += config_round_trip(up, up_model.config, path, "float32")
  with torch.no_grad():
    theirs = model(torch.as_tensor(ids)).logits.numpy()
    own = up_model(torch.as_tensor(ids)).logits.numpy()
  check = compare_arrays("export float32: logits, full attention",
                         ours.logits(ids, params=mine), theirs, TOL_LOGITS)
  check.add_note(f"upstream's own save: max_rel "
                 f"{np.abs(own - theirs).max() / np.abs(theirs).max():.1e}"
                 " away (the noise)")
  out.append(check)
  n, mask_id = opts.new_tokens, opts.vocab - 1
  prompt = rng.integers(1, mask_id, (2, opts.prompt_len))
  pids, pmask = left_padded(prompt, [0, opts.prompt_len // 3])
  for alg, steps, padded in (("maskgit_plus", n, False),
                             ("entropy", max(1, n // 2), True)):
    x, m = (pids, pmask) if padded else (prompt, None)
    kw = dict(max_new_tokens=n, steps=steps, alg=alg, temperature=0.0,
              top_k=None, top_p=None)
    theirs, _ = upstream_generate(up, model, x, m, **kw)
    got, _ = ours.generate(x, m, params=mine, **kw)
    out.append(compare_tokens(
        f"export float32: sample {alg} {n} new/{steps} steps"
        + (" padded" if padded else ""), got[:, -n:], theirs[:, -n:]))
  return out


def export_bfloat16(up, up_model, ours: Ours, ids, mine,
                    path) -> list[Check]:
  """bfloat16 export (trm.export's default), loaded in its stored dtype."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  model, info = load_export(up, path, "auto")
  out = [read_from_file("export bfloat16: every tensor read from the file",
                        model, info, path)]
  out += config_round_trip(up, up_model.config, path, "bfloat16")
  rounded = bf16_rounded(mine)
  with torch.no_grad():
    theirs = model(torch.as_tensor(ids)).logits.float().numpy()
    wide = model.float()(torch.as_tensor(ids)).logits.numpy()
  out.append(compare_arrays(
      "export bfloat16: logits, bfloat16 compute",
      ours.logits(ids, dtype="bfloat16", params=rounded).astype(np.float32),
      theirs, TOL_BF16))
  out.append(compare_arrays("export bfloat16: logits, weights in float32",
                            ours.logits(ids, params=rounded), wide,
                            TOL_LOGITS))
  return out


def export_auto(ours: Ours, ids, mine, path) -> list[Check]:
  """trm.export's whole path (the source's remote code copied, auto_map)
  read by AutoModel with trust_remote_code."""
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    theirs = load_auto(path)(torch.as_tensor(ids)).logits.numpy()
  return [compare_arrays("export: AutoModel(trust_remote_code) logits",
                         ours.logits(ids, params=mine), theirs, TOL_LOGITS)]


def check_export(up, up_model, ours: Ours, opts: Options,
                 rng) -> list[Check]:
  """Our params, noised, written by our exporter, read by upstream (see
  `export` above). A stage whose export or load raises is one FAIL line
  naming the error."""
  written = noised(ours.params, opts.seed + 6)
  mine = perturb_params(written) if opts.perturb else written
  n, mask_id = opts.new_tokens, opts.vocab - 1
  ids = rng.integers(1, mask_id, (3, opts.prompt_len + n))
  ids[:, -n // 2:] = mask_id
  out = []
  with tempfile.TemporaryDirectory(prefix="upstream_dream_export_") as root:
    # The source directory of the trm.export path: upstream's remote code
    # beside a tokenizer.json (the file trm.export insists on).
    source = os.path.join(root, "source")
    os.makedirs(source)
    for file in MODEL_FILES:
      shutil.copy(os.path.join(model_dir(opts.upstream_dir), file), source)
    with open(os.path.join(source, "tokenizer.json"), "w") as f:
      f.write("{}")
    stages = [
        ("float32", "float32", None, lambda path: export_float32(
            up, up_model, ours, opts, ids, rng, mine, path)),
        ("bfloat16", "bfloat16", None, lambda path: export_bfloat16(
            up, up_model, ours, ids, mine, path)),
        ("auto", "float32", source,
         lambda path: export_auto(ours, ids, mine, path))]
    for name, dtype, src, run in stages:
      path = os.path.join(root, name)
      try:
        export_ours(ours, written, path, dtype, source=src)
        out += run(path)
      except Exception as e:  # pylint: disable=broad-except
        out.append(Check(f"export {name}: written and loaded", False,
                         figures="raised",
                         note=f"{type(e).__name__}: {e}"[:300]))
  return out


def run_checks(opts: Options, report: common.Report) -> dict:
  import numpy as np  # pylint: disable=g-import-not-at-top
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  files = upstream_files(opts.upstream_dir)
  commit = upstream_commit(opts, files)
  up, trainer, shimmed = import_upstream(opts.upstream_dir)
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_default_matmul_precision", "highest")
  info = {"upstream_commit": commit, "upstream_files": files,
          "shimmed_modules": shimmed, "torch": torch.__version__,
          "transformers": transformers.__version__, "jax": jax.__version__}
  print(f"upstream commit: {commit}")
  for path, blob in files.items():
    print(f"  {path} blob {blob}")
  print(f"torch {torch.__version__}, transformers {transformers.__version__},"
        f" jax {jax.__version__}"
        + (f"; stand-ins for {', '.join(shimmed)}" if shimmed else ""))
  port = port_model = None
  # The checkpoint: written once, read by every side, then removed.
  with tempfile.TemporaryDirectory(prefix="upstream_dream_") as directory:
    up_model = build_checkpoint(up, opts, directory)
    ours = Ours(directory, opts.perturb)
    if "reference" in opts.checks:
      sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
          os.path.abspath(__file__))), "reference"))
      import dream_torch_sampler as port  # pylint: disable=g-import-not-at-top
      port_model = port.qwen2_from_hf_dir(directory)
  print(f"model: vocab {opts.vocab}, hidden {opts.hidden}, {opts.layers} "
        f"layers, 4 q / 2 kv heads, theta 1e6, float32, LM head "
        f"x{opts.head_scale:g}; prompt {opts.prompt_len} + {opts.new_tokens} "
        f"new" + ("; PERTURBED (ours, q_proj bias)" if opts.perturb else ""),
        flush=True)
  emit = report.extend
  if "forward" in opts.checks:
    emit(check_forward(up_model, ours, opts, np.random.default_rng(1)))
  if "reference" in opts.checks:
    emit(check_reference_forward(port_model, up_model, opts,
                                 np.random.default_rng(2)))
  if "sampling" in opts.checks or "reference" in opts.checks:
    new = check_sampling(up, up_model, ours, opts, np.random.default_rng(3),
                         port, port_model)
    if "sampling" not in opts.checks:
      new = [c for c in new if c.name.startswith("port")]
    if "reference" not in opts.checks:
      new = [c for c in new if not c.name.startswith("port")]
    emit(new)
  if "draws" in opts.checks:
    emit(check_draws(up, opts, np.random.default_rng(5)))
  if "loss" in opts.checks:
    if trainer is None:
      report.skip("loss", "--upstream_dir has no dllm trainer files "
                  f"{', '.join(TRAINER_FILES)}")
    else:
      emit(check_loss(trainer, up_model, ours, opts,
                      np.random.default_rng(4)))
  if "export" in opts.checks:
    emit(check_export(up, up_model, ours, opts, np.random.default_rng(6)))
  return info


def main(argv) -> int:
  try:
    opts = parse_args(argv)
  except UsageError as e:
    return common.refuse("upstream_dream.py", e)
  report = common.Report()
  info = run_checks(opts, report)
  return report.finish(opts.json, **info, perturb=opts.perturb)

if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
