r"""Quality of cached block decoding on a fine-tuned model (greedy).

  python -m trm.main --config=configs/diffucoder_7b.py:tiny --workdir=W \
      --config.seq_len=256 --config.total_steps=600
  python benchmarks/quality/dream_cached_quality.py --workdir=W [--prompts=16 \
      --prompt_len=128 --max_new_tokens=128]

The workdir's `seq_len` must hold prompt_len + max_new_tokens (the model's
position limit); for 512 + 512 fine-tune at `--config.seq_len=1024`.

Prompts are byte windows of held-out code (this repository's `tests/` and
`benchmarks/` files; `:tiny` trains on `trm/**/*.py`), each followed by its
true continuation. For the exact sampler and each cached variant this prints
  - the fraction of generated tokens equal to the exact sampler's;
  - the model's held-out loss on the generated text: the masked-diffusion
    loss of `configs/diffucoder_7b.py` (1/t-weighted cross-entropy on masked
    completion tokens, the prompt never masked), averaged over 8 noise
    draws; the same loss of the true continuation is printed for scale;
  - the top-token share: per row, the fraction of generated tokens equal
    to the row's most frequent one (averaged; high = repetitive text).
Lower loss means text the model finds likelier; a cache that corrupts the
decoding shows up as a higher loss and a lower agreement.
"""
from __future__ import annotations

import glob
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags, logging  # pylint: disable=wrong-import-position

_WORKDIR = flags.DEFINE_string("workdir", None, "A `:tiny` fine-tuning "
                               "workdir.", required=True)
_PROMPTS = flags.DEFINE_integer("prompts", 16, "Held-out prompts.")
_PROMPT = flags.DEFINE_integer("prompt_len", 128, "Prompt bytes.")
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Generated tokens.")
_BLOCK = flags.DEFINE_integer("block_length", 32, "Tokens per block.")
_THRESHOLD = flags.DEFINE_float("threshold", 0.9, "Parallel decoding "
                                "threshold of the threshold variants.")
_VARIANTS = flags.DEFINE_list(
    "variants", ["exact", "prefix", "prefix_threshold", "dual",
                 "dual_threshold"], "Samplers to run (agreement needs exact).")
_ALG = flags.DEFINE_enum("alg", "entropy", ["origin", "maskgit_plus",
                                             "topk_margin", "entropy"],
                         "Reveal order of the exact and fixed-step samplers "
                         "(the threshold rule ranks by token probability).")
_TEMPERATURE = flags.DEFINE_float(
    "temperature", 0.0, "0: greedy. Above 0 the tokens are drawn (top_k 50),"
    " so agreement with the exact sampler no longer measures the cache; the "
    "held-out loss and the top-token share still compare the samplers.")


def held_out_windows(count: int, length: int) -> list[bytes]:
  """`count` byte windows of `length`, one per file, from files `:tiny`
  never trains on."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  # The scripts of benchmarks/'s groups (not gpu/'s kit), by file name: the
  # order they had when they lay in benchmarks/ itself, before tests/.
  scripts = [path for path in glob.glob(os.path.join(root, "benchmarks", "*",
                                                     "*.py"))
             if os.path.basename(os.path.dirname(path)) != "gpu"]
  files = (sorted(scripts, key=os.path.basename)
           + sorted(glob.glob(os.path.join(root, "tests", "*.py"))))
  out = []
  for path in files:
    data = open(path, "rb").read()
    if len(data) >= 2 * length:
      mid = len(data) // 2
      out.append(data[mid:mid + length])
    if len(out) == count:
      break
  return out


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax's restore chatter
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from trm.families.dream import loss as diffusion_loss  # pylint: disable=g-import-not-at-top
  from trm.families.dream.inference import DiffusionLM  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top

  lm = DiffusionLM.from_pretrained(_WORKDIR.value, dtype="float32")
  p, n = _PROMPT.value, _NEW.value
  windows = held_out_windows(_PROMPTS.value, p + n)
  prompts = [w[:p].decode("utf-8", "replace") for w in windows]
  truth = np.array([list(w) for w in windows], np.int32)
  model = dream.Dream(lm.cfg)

  @jax.jit
  def loss_of(tokens, key):
    maskable = jnp.arange(tokens.shape[1])[None, :] >= p
    maskable = jnp.broadcast_to(maskable, tokens.shape)
    noisy, masked, t = diffusion_loss.add_noise(
        key, tokens, maskable, lm.cfg.mask_token_id)
    hidden = model.apply({"params": lm.params}, noisy,
                         method=dream.Dream.hidden)
    return diffusion_loss.shifted_masked_loss(
        hidden, dream.gather_head(dream.head_kernel(lm.params), model.cfg),
        lambda h, table: dream.head_logits(h, table, model.cfg), tokens,
        masked, t)[0]

  def held_out_loss(tokens):
    return float(np.mean([loss_of(jnp.asarray(tokens), jax.random.key(s))
                          for s in range(8)]))

  variants = {"exact": {}}
  for cache in ("prefix", "dual"):
    variants[cache] = dict(cache=cache, block_length=_BLOCK.value)
    variants[f"{cache}_threshold"] = dict(
        cache=cache, block_length=_BLOCK.value, threshold=_THRESHOLD.value)
  t = _TEMPERATURE.value
  mode = f"temperature {t}" if t > 0 else "greedy"
  print(f"{_WORKDIR.value}: {len(prompts)} held-out prompts of {p} bytes + "
        f"{n} new, {mode}, alg={_ALG.value}, top_k 50; true continuation loss "
        f"{held_out_loss(truth):.4f}")
  unknown = set(_VARIANTS.value) - set(variants)
  if unknown:
    raise app.UsageError(f"--variants: unknown {sorted(unknown)}; choose "
                         f"from {sorted(variants)}")
  results = {}
  for name, extra in variants.items():
    if name not in _VARIANTS.value:
      continue
    gen = lm.generate(prompts, max_new_tokens=n, steps=n, alg=_ALG.value,
                      temperature=t, return_tokens=True, **extra)
    tokens = gen.tokens[:, -(p + n):]
    # Byte prompts may encode to more than p tokens (never here: bytes).
    results[name] = tokens
    equal = (np.mean(tokens[:, p:] == results["exact"][:, p:])
             if "exact" in results else float("nan"))
    # How repetitive the text is: a tiny model's greedy text often collapses
    # to one byte (spaces), which makes agreement easy.
    top = np.mean([np.bincount(row).max() / len(row)
                   for row in tokens[:, p:]])
    print(f"{name:17s} agreement {equal:.4f}  held-out loss "
          f"{held_out_loss(tokens):.4f}  top-token share {top:.3f}  "
          f"({lm.timings['run_seconds']:.1f} s, compile "
          f"{lm.timings['compile_seconds']:.1f} s)", flush=True)


if __name__ == "__main__":
  app.run(main)
