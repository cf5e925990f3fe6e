r"""PyTorch nanoGPT baseline: time per training iteration and MFU on CPU.

  python benchmarks/reference/nanogpt_torch.py                          # README CPU recipe
  python benchmarks/reference/nanogpt_torch.py --nanogpt_dir=~/nanoGPT  # nanoGPT's own model.py
  python benchmarks/reference/nanogpt_torch.py --iters=3 --warmup_iters_timing=1

The figure this produces is the denominator of "our time per iteration vs
nanoGPT's PyTorch code on CPU", so the loop follows nanoGPT's train.py as run
by its README CPU recipe (`--device=cpu --compile=False --block_size=64
--batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --dropout=0.0
--log_interval=1 ...` with the shakespeare_char config's lr 1e-3, beta2 0.99,
min_lr 1e-4, warmup 100), float32 by default (train.py's CPU path: no
autocast, the GradScaler disabled). `--dtype=bfloat16|float16` runs the
forward under torch.autocast and (float16) a GradScaler, as train.py does on
a GPU: it autocasts on CUDA only, but timing our bfloat16 step against a
float32 PyTorch one would compare two different computations.

  per iteration: lr from the warmup + cosine rule set on every param group;
  for each micro-step: forward with targets (cross entropy), loss / grad_accum,
  fetch the next batch (train.py prefetches it during the forward), backward;
  clip_grad_norm_(1.0); optimizer.step(); zero_grad(set_to_none=True);
  loss.item() (a sync every iteration, as log_interval=1 does).

Batches are random windows of a uint16 train.bin, re-opened as an np.memmap on
every call and sampled with `torch.randint(len(data) - block_size, (B,))`, as
train.py does. An iteration's time is taken like train.py's `dt` (from the end
of the previous iteration to the end of this one), and the reported figure is
the median over `--iters` timed iterations after `--warmup_iters_timing`
untimed ones. Evaluation (train.py evaluates at iteration 0 and every
eval_interval) and checkpointing are not timed.

The model is either nanoGPT's own `model.py` (`--nanogpt_dir` pointing at a
checkout: its GPT, GPTConfig and configure_optimizers, so the figure is
literally nanoGPT's code) or, by default, the re-implementation below, written
from nanoGPT's documented architecture with the same module tree and state-dict
names, so a checkpoint of one loads into the other.

MFU uses nanoGPT's estimate_mfu FLOP count (`trm.core.mfu.nanogpt_flops_per_iter`)
divided by the JAX-measured CPU float32 matmul peak
(`trm.core.mfu.measured_cpu_peak_flops`): the same denominator our JAX trainer's
CPU MFU uses, so the two MFU figures compare directly. torch's own measured
matmul peak is printed too, for reference.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)


# ---------------------------------------------------------------------------
# Model: nanoGPT's GPT re-implemented (module and parameter names match).
# ---------------------------------------------------------------------------


class Config:
  """Model hyper-parameters, with the fields nanoGPT's GPTConfig has."""

  def __init__(self, block_size: int = 1024, vocab_size: int = 50304,
               n_layer: int = 12, n_head: int = 12, n_embd: int = 768,
               dropout: float = 0.0, bias: bool = True):
    self.block_size = block_size
    self.vocab_size = vocab_size
    self.n_layer = n_layer
    self.n_head = n_head
    self.n_embd = n_embd
    self.dropout = dropout
    self.bias = bias


class LayerNorm(nn.Module):
  """LayerNorm whose bias can be switched off (the `bias=False` config)."""

  def __init__(self, dim: int, bias: bool):
    super().__init__()
    self.weight = nn.Parameter(torch.ones(dim))
    self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

  def forward(self, x):
    return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
  """Fused q/k/v projection, PyTorch SDPA with a causal mask, output proj."""

  def __init__(self, cfg: Config):
    super().__init__()
    if cfg.n_embd % cfg.n_head:
      raise ValueError(f"n_embd={cfg.n_embd} not divisible by "
                       f"n_head={cfg.n_head}")
    self.n_head = cfg.n_head
    self.dropout = cfg.dropout
    self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
    self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
    self.resid_dropout = nn.Dropout(cfg.dropout)

  def forward(self, x):
    b, t, c = x.shape
    heads = lambda y: y.view(b, t, self.n_head, c // self.n_head).transpose(
        1, 2)
    q, k, v = (heads(y) for y in self.c_attn(x).split(c, dim=2))
    y = F.scaled_dot_product_attention(
        q, k, v, dropout_p=self.dropout if self.training else 0.0,
        is_causal=True)
    y = y.transpose(1, 2).contiguous().view(b, t, c)
    return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
  """C -> 4C, exact (erf) GELU, 4C -> C."""

  def __init__(self, cfg: Config):
    super().__init__()
    self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
    self.gelu = nn.GELU()
    self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
    self.dropout = nn.Dropout(cfg.dropout)

  def forward(self, x):
    return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
  """Pre-LayerNorm residual block: attention, then MLP."""

  def __init__(self, cfg: Config):
    super().__init__()
    self.ln_1 = LayerNorm(cfg.n_embd, cfg.bias)
    self.attn = CausalSelfAttention(cfg)
    self.ln_2 = LayerNorm(cfg.n_embd, cfg.bias)
    self.mlp = MLP(cfg)

  def forward(self, x):
    x = x + self.attn(self.ln_1(x))
    return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
  """Decoder-only transformer with nanoGPT's parameter tree and init."""

  def __init__(self, cfg: Config):
    super().__init__()
    self.config = cfg
    self.transformer = nn.ModuleDict(dict(
        wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
        wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
        drop=nn.Dropout(cfg.dropout),
        h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
        ln_f=LayerNorm(cfg.n_embd, cfg.bias),
    ))
    self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
    # Tie the output projection to the token embedding (one tensor).
    self.transformer.wte.weight = self.lm_head.weight
    for module in self.modules():
      if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
      if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    # GPT-2's scaled init of the two projections that write to the residual
    # stream, so its variance does not grow with depth.
    for name, param in self.named_parameters():
      if name.endswith("c_proj.weight"):
        nn.init.normal_(param, mean=0.0,
                        std=0.02 / math.sqrt(2 * cfg.n_layer))

  def get_num_params(self, non_embedding: bool = True) -> int:
    """Parameters, the tied wte/lm_head once; wpe left out if non_embedding."""
    n = sum(p.numel() for p in self.parameters())
    if non_embedding:
      n -= self.transformer.wpe.weight.numel()
    return n

  def forward(self, idx, targets=None):
    _, t = idx.shape
    if t > self.config.block_size:
      raise ValueError(f"sequence length {t} > block_size "
                       f"{self.config.block_size}")
    pos = torch.arange(t, dtype=torch.long, device=idx.device)
    x = self.transformer.drop(self.transformer.wte(idx) +
                              self.transformer.wpe(pos))
    for block in self.transformer.h:
      x = block(x)
    x = self.transformer.ln_f(x)
    if targets is None:
      return self.lm_head(x[:, [-1], :]), None
    logits = self.lm_head(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)),
                           targets.view(-1), ignore_index=-1)
    return logits, loss

  def configure_optimizers(self, weight_decay, learning_rate, betas,
                           device_type):
    """AdamW; weight decay only on matrices/embeddings (dim >= 2)."""
    params = [p for p in self.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2],
         "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # nanoGPT asks for the fused kernel on CUDA only; on CPU it is the default
    # (per-tensor) implementation.
    fused = device_type == "cuda"
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas,
                             fused=fused)


def _load_nanogpt(nanogpt_dir: str):
  """nanoGPT's (GPT, GPTConfig) imported from `<nanogpt_dir>/model.py`."""
  path = os.path.join(os.path.expanduser(nanogpt_dir), "model.py")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--nanogpt_dir: no model.py at {path}")
  spec = importlib.util.spec_from_file_location("nanogpt_model", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.GPT, module.GPTConfig


# ---------------------------------------------------------------------------
# Data: nanoGPT's train.bin (uint16 token ids) + vocab size.
# ---------------------------------------------------------------------------


def _prepare_char_inline(text: str, out_dir: str) -> None:
  """Character-level prep: sorted(set(text)) vocab, 90/10 split, uint16.

  Only used when `trm.data.text.windows.prepare_char` is not importable; writes the
  same file layout (train.bin, val.bin, meta.json with vocab_size/itos/stoi).
  """
  chars = sorted(set(text))
  stoi = {ch: i for i, ch in enumerate(chars)}
  ids = np.array([stoi[ch] for ch in text], dtype=np.uint16)
  split = int(len(ids) * 0.9)
  os.makedirs(out_dir, exist_ok=True)
  ids[:split].tofile(os.path.join(out_dir, "train.bin"))
  ids[split:].tofile(os.path.join(out_dir, "val.bin"))
  with open(os.path.join(out_dir, "meta.json"), "w") as f:
    json.dump({"vocab_size": len(chars), "tokenizer": "char",
               "itos": {str(i): ch for i, ch in enumerate(chars)},
               "stoi": stoi}, f)


def ensure_data(data_dir: str, input_path: str) -> tuple[str, int]:
  """(path of train.bin, vocab_size), building both from `input_path` if the
  directory has no train.bin + meta.json yet."""
  train = os.path.join(data_dir, "train.bin")
  meta = os.path.join(data_dir, "meta.json")
  if not (os.path.isfile(train) and os.path.isfile(meta)):
    if not os.path.isfile(input_path):
      raise FileNotFoundError(
          f"{data_dir} has no train.bin + meta.json and --input={input_path} "
          "does not exist")
    with open(input_path, encoding="utf-8") as f:
      text = f.read()
    try:  # The project's own prep, when present; same file format.
      from trm.data.text.preparation import prepare_char  # pylint: disable=g-import-not-at-top
    except ImportError:
      prepare_char = None
    if prepare_char is not None:
      prepare_char(text, data_dir)
    if not (os.path.isfile(train) and os.path.isfile(meta)):
      _prepare_char_inline(text, data_dir)
  with open(meta) as f:
    vocab_size = int(json.load(f)["vocab_size"])
  return train, vocab_size


def get_batch(train_bin: str, block_size: int, batch_size: int):
  """Random windows as nanoGPT's get_batch('train') on CPU draws them."""
  # Re-opened each call, as train.py does (a long-lived memmap grows RSS).
  data = np.memmap(train_bin, dtype=np.uint16, mode="r")
  ix = torch.randint(len(data) - block_size, (batch_size,))
  x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64))
                   for i in ix])
  y = torch.stack([
      torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64))
      for i in ix])
  return x, y


def nanogpt_lr(it: int, learning_rate: float, warmup_iters: int,
               lr_decay_iters: int, min_lr: float) -> float:
  """Linear warmup (non-zero at it=0), cosine to min_lr, then min_lr."""
  if it < warmup_iters:
    return learning_rate * (it + 1) / (warmup_iters + 1)
  if it > lr_decay_iters:
    return min_lr
  ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
  coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
  return min_lr + coeff * (learning_rate - min_lr)


# ---------------------------------------------------------------------------
# Timing.
# ---------------------------------------------------------------------------


def torch_matmul_peak_flops(size: int = 1024, repeats: int = 5,
                            min_seconds: float = 0.25,
                            dtype: str = "float32") -> float:
  """Best FLOP/s of a `dtype` size^3 torch.mm on CPU, sampled as
  `trm.core.mfu.measured_matmul_peak_flops` samples JAX's (>= `repeats` calls and
  >= `min_seconds`)."""
  g = torch.Generator().manual_seed(0)
  a = torch.randn(size, size, generator=g).to(getattr(torch, dtype))
  b = torch.randn(size, size, generator=g).to(getattr(torch, dtype))
  for _ in range(3):  # MKL's first calls at a size are slow (set-up).
    torch.mm(a, b)
  best = float("inf")
  calls = 0
  begin = time.perf_counter()
  while calls < repeats or time.perf_counter() - begin < min_seconds:
    start = time.perf_counter()
    torch.mm(a, b)
    best = min(best, time.perf_counter() - start)
    calls += 1
  return 2.0 * size**3 / best


DTYPES = ("float32", "bfloat16", "float16")  # configs/gpt.py's dtype values


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  bool_ = lambda s: s.lower() in ("1", "true", "yes", "y")
  a = p.add_argument
  a("--iters", type=int, default=50, help="timed iterations")
  a("--warmup_iters_timing", type=int, default=5,
    help="untimed iterations before the timed ones")
  a("--threads", type=int, default=os.cpu_count(),
    help="torch.set_num_threads")
  a("--nanogpt_dir", default=None,
    help="a karpathy/nanoGPT checkout: time its own model.py")
  a("--data_dir", default=os.path.join(_REPO, "runs", "data",
                                       "shakespeare_char"),
    help="directory with nanoGPT-format train.bin + meta.json")
  a("--input", default=os.path.join(_REPO, "..", "shared", "data",
                                    "tinyshakespeare", "input.txt"),
    help="text to build --data_dir from when it is empty")
  a("--seed", type=int, default=1337)
  a("--dtype", default="float32", choices=DTYPES,
    help="compute dtype: float32, or torch.autocast to bfloat16 / float16 "
    "(with a GradScaler), as train.py's dtype on a GPU")
  # Model (README CPU recipe).
  a("--block_size", type=int, default=64)
  a("--batch_size", type=int, default=12)
  a("--gradient_accumulation_steps", type=int, default=1)
  a("--n_layer", type=int, default=4)
  a("--n_head", type=int, default=4)
  a("--n_embd", type=int, default=128)
  a("--dropout", type=float, default=0.0)
  a("--bias", type=bool_, default=False)
  a("--vocab_size", type=int, default=None,
    help="default: meta.json's vocab_size")
  # Optimiser and schedule (shakespeare_char config, CPU recipe's 2000 iters).
  a("--learning_rate", type=float, default=1e-3)
  a("--weight_decay", type=float, default=1e-1)
  a("--beta1", type=float, default=0.9)
  a("--beta2", type=float, default=0.99)
  a("--grad_clip", type=float, default=1.0)
  a("--warmup_iters", type=int, default=100)
  a("--lr_decay_iters", type=int, default=2000)
  a("--min_lr", type=float, default=1e-4)
  a("--peak_size", type=int, default=1024,
    help="matrix size of the peak FLOP/s measurements")
  return p


def parse_args(argv=None) -> argparse.Namespace:
  return build_parser().parse_args(argv)


def run(args: argparse.Namespace | Mapping[str, Any] | None = None) -> dict:
  """Times nanoGPT's CPU training loop; returns the figures as a dict.

  `args`: a Namespace from `parse_args`, or a mapping of flag names to values
  (missing ones take their defaults), so other benchmarks can call
  `run({"iters": 10})`.
  """
  if not isinstance(args, argparse.Namespace):
    defaults = vars(parse_args([]))
    unknown = set(args or {}) - set(defaults)
    if unknown:
      raise ValueError(f"unknown arguments {sorted(unknown)}")
    defaults.update(args or {})
    args = argparse.Namespace(**defaults)
  if args.iters < 1 or args.warmup_iters_timing < 0:
    raise ValueError("--iters must be >= 1 and --warmup_iters_timing >= 0")

  from trm.core import mfu as mfu_lib  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(args.threads)
  torch.manual_seed(args.seed)
  train_bin, meta_vocab = ensure_data(args.data_dir, args.input)
  model_args = dict(block_size=args.block_size, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd,
                    dropout=args.dropout, bias=args.bias,
                    vocab_size=args.vocab_size or meta_vocab)
  if args.nanogpt_dir:
    gpt_cls, config_cls = _load_nanogpt(args.nanogpt_dir)
    source = f"nanoGPT model.py from {args.nanogpt_dir}"
  else:
    gpt_cls, config_cls = GPT, Config
    source = "trm re-implementation of nanoGPT's model.py"
  model = gpt_cls(config_cls(**model_args))
  model.train()
  optimizer = model.configure_optimizers(
      args.weight_decay, args.learning_rate, (args.beta1, args.beta2), "cpu")
  num_params = model.get_num_params()
  accum = args.gradient_accumulation_steps

  # Peaks first, so neither measurement's idle worker threads linger into the
  # timed loop. JAX's figure is cached per process: every benchmark in a run
  # divides by the same number.
  import jax  # pylint: disable=g-import-not-at-top
  peak = mfu_lib.measured_cpu_peak_flops(args.dtype, size=args.peak_size)
  peak_description = (
      f"JAX {jax.__version__} measured CPU {args.dtype} matmul peak "
      f"({args.peak_size}^3, {peak / 1e9:.1f} GFLOP/s)")
  torch_peak = torch_matmul_peak_flops(args.peak_size, dtype=args.dtype)
  # train.py's ctx and scaler, for args.dtype on this CPU.
  ctx = (contextlib.nullcontext() if args.dtype == "float32" else
         torch.autocast(device_type="cpu", dtype=getattr(torch, args.dtype)))
  scaler = torch.amp.GradScaler("cpu", enabled=args.dtype == "float16")

  times = []
  losses = []
  x, y = get_batch(train_bin, args.block_size, args.batch_size)
  t0 = time.perf_counter()
  for it in range(args.warmup_iters_timing + args.iters):
    lr = nanogpt_lr(it, args.learning_rate, args.warmup_iters,
                    args.lr_decay_iters, args.min_lr)
    for group in optimizer.param_groups:
      group["lr"] = lr
    for _ in range(accum):
      with ctx:
        _, loss = model(x, y)
        loss = loss / accum
      x, y = get_batch(train_bin, args.block_size, args.batch_size)
      scaler.scale(loss).backward()
    if args.grad_clip:
      scaler.unscale_(optimizer)
      torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item() * accum)
    t1 = time.perf_counter()
    if it >= args.warmup_iters_timing:
      times.append(t1 - t0)
    t0 = t1

  seconds = statistics.median(times)
  flops = mfu_lib.nanogpt_flops_per_iter(
      num_params, args.n_layer, args.n_head, args.n_embd, args.block_size,
      args.batch_size * accum)
  return {
      "torch_version": torch.__version__,
      "threads": args.threads,
      "model_source": source,
      "num_params_non_embedding": num_params,
      "iters": args.iters,
      "ms_per_iter": seconds * 1e3,
      "ms_per_iter_mean": statistics.fmean(times) * 1e3,
      "ms_per_iter_min": min(times) * 1e3,
      "ms_per_iter_all": [t * 1e3 for t in times],
      "tokens_per_iter": args.batch_size * accum * args.block_size,
      "flops_per_iter": flops,
      "mfu": mfu_lib.mfu(flops, seconds, 1, peak),
      "peak_flops": peak,
      "peak_description": peak_description,
      "torch_peak_flops": torch_peak,
      "first_loss": losses[0],
      "last_loss": losses[-1],
      "model_args": model_args,
      "dtype": args.dtype,
  }


def report(result: dict) -> str:
  """The printed lines, one per figure."""
  torch_mfu = (result["flops_per_iter"] / (result["ms_per_iter"] / 1e3) /
               result["torch_peak_flops"])
  return "\n".join([
      f"model: {result['model_source']}, "
      f"{result['num_params_non_embedding'] / 1e6:.2f}M non-embedding "
      f"params, {result['model_args']}, "
      f"{result['tokens_per_iter']} tokens/iter; loss "
      f"{result['first_loss']:.4f} -> {result['last_loss']:.4f}",
      f"torch {result['torch_version']} CPU threads={result['threads']} "
      f"dtype={result['dtype']}: {result['ms_per_iter']:.2f} ms/iter (median of {result['iters']} "
      f"timed iters; mean {result['ms_per_iter_mean']:.2f}, min "
      f"{result['ms_per_iter_min']:.2f}), mfu {100 * result['mfu']:.2f}% of "
      f"{result['peak_description']}",
      f"torch {result['torch_version']} CPU threads={result['threads']}: "
      f"measured {result['dtype']} matmul peak "
      f"{result['torch_peak_flops'] / 1e9:.1f} "
      f"GFLOP/s (reference; mfu against it {100 * torch_mfu:.2f}%)",
  ])


def main(argv=None):
  # A CPU benchmark: keep JAX (used only for the peak) off any accelerator
  # and off accelerator-plugin probing, unless the caller chose a platform.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  print(report(run(parse_args(argv))), flush=True)


if __name__ == "__main__":
  main()
