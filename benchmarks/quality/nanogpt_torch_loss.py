r"""Validation loss of nanoGPT's CPU recipe in PyTorch, for comparison with
`python -m trm.main --config=configs/gpt.py:shakespeare_char_cpu`.

  python benchmarks/quality/nanogpt_torch_loss.py --seed=1337 \
      --data_dir=runs/data/shakespeare_char

The model and optimizer are `benchmarks/reference/nanogpt_torch.py`'s (nanoGPT's
model.py re-implemented: state-dict names, init, AdamW groups); the loop is
nanoGPT train.py's on CPU: get_batch (random windows with replacement),
get_lr, clipping at 1.0, estimate_loss every 250 iterations over
--eval_iters batches per split, and a final estimate over
--final_eval_iters batches.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

# benchmarks/reference/ holds the PyTorch port this compares with.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "reference"))
import nanogpt_torch  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--seed", type=int, default=1337)
  p.add_argument("--data_dir", default="runs/data/shakespeare_char")
  p.add_argument("--max_iters", type=int, default=2000)
  p.add_argument("--eval_interval", type=int, default=250)
  p.add_argument("--eval_iters", type=int, default=20)
  p.add_argument("--final_eval_iters", type=int, default=200)
  p.add_argument("--threads", type=int, default=os.cpu_count())
  args = p.parse_args()
  block, batch = 64, 12
  torch.manual_seed(args.seed)
  torch.set_num_threads(args.threads)
  model = nanogpt_torch.GPT(nanogpt_torch.Config(
      block_size=block, n_layer=4, n_head=4, n_embd=128, dropout=0.0,
      bias=False, vocab_size=65))
  optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")

  def get_batch(split):
    data = np.memmap(os.path.join(args.data_dir, f"{split}.bin"),
                     dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block, (batch,))
    x = torch.stack([torch.from_numpy(data[i:i + block].astype(np.int64))
                     for i in ix])
    y = torch.stack([torch.from_numpy(
        data[i + 1:i + 1 + block].astype(np.int64)) for i in ix])
    return x, y

  @torch.no_grad()
  def estimate_loss(iters):
    model.eval()
    out = {split: float(np.mean([model(*get_batch(split))[1].item()
                                 for _ in range(iters)]))
           for split in ("train", "val")}
    model.train()
    return out

  start = time.time()
  for it in range(args.max_iters + 1):
    if it % args.eval_interval == 0:
      losses = estimate_loss(args.eval_iters)
      print(f"step {it}: train loss {losses['train']:.4f}, "
            f"val loss {losses['val']:.4f}", flush=True)
    if it == args.max_iters:
      break
    lr = nanogpt_torch.nanogpt_lr(it, 1e-3, 100, args.max_iters, 1e-4)
    for group in optimizer.param_groups:
      group["lr"] = lr
    _, loss = model(*get_batch("train"))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
  losses = estimate_loss(args.final_eval_iters)
  print(f"final ({args.final_eval_iters} batches): train loss "
        f"{losses['train']:.4f}, val loss {losses['val']:.4f}; "
        f"{time.time() - start:.0f} s, torch {torch.__version__}")


if __name__ == "__main__":
  main()
