"""Upstream TRM's train step in PyTorch, written from /work/shared/specs/trm.md.

One call of `TorchTRM.train_step` is upstream `pretrain.py::train_batch` on
one CPU process: streaming-ACT carry reset, the inner forward (H_cycles - 1
cycles under no_grad, the last with grad), ACTLossHead (stablemax CE in
float64 + 0.5 * BCE-sum on q_halt), backward of loss / batch, sparse sign-SGD
on the looked-up puzzle rows, AdamATan2 (imoneoi's reference math) on every
parameter, then the EMA update. Eager mode, as upstream runs without a GPU
(`DISABLE_COMPILE`); the weights come from our flax state, so both sides
start from the same point (`benchmarks/speed/trm_speed.py`, the parity test).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

IGNORE_LABEL_ID = -100


def _rms_norm(x, eps):
  x32 = x.float()
  x32 = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
  return x32.to(x.dtype)


def _rotate_half(x):
  x1, x2 = x.chunk(2, dim=-1)
  return torch.cat((-x2, x1), dim=-1)


def _log_stablemax(x, dim=-1):
  s_x = torch.where(x < 0, 1 / (1 - x + 1e-30), x + 1)
  return torch.log(s_x / s_x.sum(dim=dim, keepdim=True))


def _stablemax_cross_entropy(logits, labels, valid_mask):
  logprobs = _log_stablemax(logits.to(torch.float64), dim=-1)
  safe = torch.where(valid_mask, labels, 0).long()
  picked = torch.gather(logprobs, -1, safe.unsqueeze(-1)).squeeze(-1)
  return -torch.where(valid_mask, picked, 0)


def lr_at(base, step, warmup, total, min_ratio):
  """Upstream cosine_schedule_with_warmup_lr_lambda; step counts from 1."""
  if step < warmup:
    return base * step / max(1, warmup)
  progress = (step - warmup) / max(1, total - warmup)
  return base * (min_ratio + max(
      0.0, (1 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))))


def _flatten(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict) or hasattr(v, "items"):
      out.update(_flatten(v, f"{prefix}{k}/"))
    else:
      out[f"{prefix}{k}"] = v
  return out


class TorchTRM:
  """Parameters named by their flax paths; Linear weights kept [out, in]
  (upstream CastedLinear layout, used through F.linear)."""

  def __init__(self, cfg, params, buffers, puzzle_table, optim_config,
               total_steps):
    self.cfg = cfg
    self.dtype = getattr(torch, cfg.forward_dtype)
    self.oc = optim_config
    self.total_steps = total_steps
    self.p = {}
    for name, value in _flatten(params).items():
      t = torch.tensor(np.array(value, np.float32))
      if name.endswith("kernel"):
        t = t.T.contiguous()
      self.p[name] = t.requires_grad_(True)
    self.H_init = torch.tensor(np.array(buffers["H_init"], np.float32)).to(
        self.dtype)
    self.L_init = torch.tensor(np.array(buffers["L_init"], np.float32)).to(
        self.dtype)
    self.table = (torch.tensor(np.array(puzzle_table, np.float32))
                  if puzzle_table is not None else None)
    self.m = {k: torch.zeros_like(v) for k, v in self.p.items()}
    self.v = {k: torch.zeros_like(v) for k, v in self.p.items()}
    self.ema = {k: v.detach().clone() for k, v in self.p.items()}
    self.step = 0
    if cfg.pos_encodings == "rope":
      hd = cfg.hidden_size // cfg.num_heads
      inv_freq = 1.0 / (cfg.rope_theta ** (
          torch.arange(0, hd, 2, dtype=torch.float32) / hd))
      freqs = torch.outer(torch.arange(cfg.total_len, dtype=torch.float32),
                          inv_freq)
      emb = torch.cat((freqs, freqs), dim=-1)
      self.cos, self.sin = emb.cos(), emb.sin()

  def params_numpy(self):
    """Current parameters in flax layout ([in, out] kernels)."""
    return {k: (v.detach().T if k.endswith("kernel") else v.detach()).numpy()
            for k, v in self.p.items()}

  # ----------------------------------------------------------------- model
  def _w(self, name):
    return self.p[name].to(self.dtype)

  def _linear(self, x, name, bias=None):
    return F.linear(x, self._w(name + "/kernel"),
                    None if bias is None else self._w(name + "/bias"))

  def _swiglu(self, x, prefix):
    gate, up = self._linear(x, prefix + "/gate_up_proj").chunk(2, dim=-1)
    return self._linear(F.silu(gate) * up, prefix + "/down_proj")

  def _attention(self, x, prefix):
    cfg = self.cfg
    b, s, _ = x.shape
    heads, hd = cfg.num_heads, cfg.hidden_size // cfg.num_heads
    qkv = self._linear(x, prefix + "/qkv_proj").view(b, s, 3 * heads, hd)
    q, k, v = qkv[:, :, :heads], qkv[:, :, heads:2 * heads], qkv[:, :, 2 * heads:]
    if cfg.pos_encodings == "rope":
      cos, sin = self.cos.unsqueeze(-2), self.sin.unsqueeze(-2)
      q32, k32 = q.float(), k.float()
      q = (q32 * cos + _rotate_half(q32) * sin).to(x.dtype)
      k = (k32 * cos + _rotate_half(k32) * sin).to(x.dtype)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=False)
    out = out.transpose(1, 2).reshape(b, s, cfg.hidden_size)
    return self._linear(out, prefix + "/o_proj")

  def _net(self, h, injection):
    cfg = self.cfg
    h = h + injection
    for i in range(cfg.L_layers):
      pre = f"L_level/layers_{i}"
      if cfg.mlp_t:
        t = h.transpose(1, 2)
        t = _rms_norm(t + self._swiglu(t, pre + "/mlp_t"), cfg.rms_norm_eps)
        h = t.transpose(1, 2)
      else:
        h = _rms_norm(h + self._attention(h, pre + "/self_attn"),
                      cfg.rms_norm_eps)
      h = _rms_norm(h + self._swiglu(h, pre + "/mlp"), cfg.rms_norm_eps)
    return h

  def inner(self, z_H, z_L, inputs, puzzle_vectors):
    cfg = self.cfg
    d = cfg.hidden_size
    x = F.embedding(inputs.long(), self._w("embed_tokens/embedding"))
    if puzzle_vectors is not None:
      pad = cfg.prefix_len * d - puzzle_vectors.shape[-1]
      prefix = F.pad(puzzle_vectors.to(self.dtype), (0, pad))
      x = torch.cat((prefix.view(-1, cfg.prefix_len, d), x), dim=-2)
    if cfg.pos_encodings == "learned":
      x = 0.707106781 * (x + self._w("embed_pos"))
    x = math.sqrt(d) * x
    with torch.no_grad():
      for _ in range(cfg.H_cycles - 1):
        for _ in range(cfg.L_cycles):
          z_L = self._net(z_L, z_H + x)
        z_H = self._net(z_H, z_L)
    for _ in range(cfg.L_cycles):
      z_L = self._net(z_L, z_H + x)
    z_H = self._net(z_H, z_L)
    logits = self._linear(z_H, "lm_head")[:, cfg.prefix_len:]
    q = self._linear(z_H[:, 0], "q_head", bias=True).float()
    return z_H.detach(), z_L.detach(), logits, q[..., 0], q[..., 1]

  # ------------------------------------------------------------------- ACT
  def initial_carry(self, batch_size):
    cfg = self.cfg
    z = torch.zeros(batch_size, cfg.total_len, cfg.hidden_size,
                    dtype=self.dtype)
    return dict(z_H=z, z_L=z, steps=torch.zeros(batch_size, dtype=torch.int32),
                halted=torch.ones(batch_size, dtype=torch.bool),
                inputs=torch.zeros(batch_size, cfg.seq_len, dtype=torch.int32),
                labels=torch.full((batch_size, cfg.seq_len), IGNORE_LABEL_ID,
                                  dtype=torch.int32),
                puzzle_identifiers=torch.zeros(batch_size, dtype=torch.int32))

  def forward_loss(self, carry, batch):
    """One ACT step and ACTLossHead: (new carry, loss, metrics, local rows)."""
    cfg = self.cfg
    halted = carry["halted"]
    z_H = torch.where(halted.view(-1, 1, 1), self.H_init, carry["z_H"])
    z_L = torch.where(halted.view(-1, 1, 1), self.L_init, carry["z_L"])
    steps = torch.where(halted, 0, carry["steps"])
    data = {k: torch.where(halted.view((-1,) + (1,) * (batch[k].ndim - 1)),
                           batch[k], carry[k]) for k in batch}
    local = None
    if self.table is not None:  # CastedSparseEmbedding in train mode
      local = self.table[data["puzzle_identifiers"].long()].clone()
      local.requires_grad_(True)
    z_H, z_L, logits, q_halt, _ = self.inner(z_H, z_L, data["inputs"], local)
    with torch.no_grad():
      steps = steps + 1
      halted = steps >= cfg.halt_max_steps
      if cfg.halt_max_steps > 1:
        halted = halted | (q_halt > 0)
        min_halt = ((torch.rand_like(q_halt) < cfg.halt_exploration_prob)
                    * torch.randint_like(steps, 2, cfg.halt_max_steps + 1))
        halted = halted & (steps >= min_halt)
    new_carry = dict(z_H=z_H, z_L=z_L, steps=steps, halted=halted, **data)

    labels = data["labels"]
    with torch.no_grad():
      mask = labels != IGNORE_LABEL_ID
      loss_counts = mask.sum(-1)
      divisor = loss_counts.clamp_min(1).unsqueeze(-1)
      is_correct = mask & (torch.argmax(logits, -1) == labels)
      seq_correct = is_correct.sum(-1) == loss_counts
      valid = halted & (loss_counts > 0)
      metrics = dict(
          count=valid.sum(),
          accuracy=torch.where(valid, (is_correct.float() / divisor).sum(-1),
                               0).sum(),
          exact_accuracy=(valid & seq_correct).sum(),
          q_halt_accuracy=(valid & ((q_halt >= 0) == seq_correct)).sum(),
          steps=torch.where(valid, steps, 0).sum())
    lm_loss = (_stablemax_cross_entropy(logits, labels, mask) / divisor).sum()
    q_halt_loss = F.binary_cross_entropy_with_logits(
        q_halt, seq_correct.to(q_halt.dtype), reduction="sum")
    metrics.update(lm_loss=lm_loss.detach(), q_halt_loss=q_halt_loss.detach())
    return new_carry, lm_loss + 0.5 * q_halt_loss, metrics, local

  # ------------------------------------------------------------- optimizers
  def train_step(self, carry, batch):
    oc, rows = self.oc, carry["halted"].shape[0]
    carry, loss, metrics, local = self.forward_loss(carry, batch)
    (loss / rows).backward()
    self.step += 1
    sched = lambda base: lr_at(base, self.step, oc.warmup_steps,
                               self.total_steps, oc.lr_min_ratio)
    with torch.no_grad():
      if local is not None:
        self._sign_sgd(carry["puzzle_identifiers"].long(), local.grad,
                       sched(oc.puzzle_emb_lr), oc.puzzle_emb_weight_decay)
      self._adam_atan2(sched(oc.lr))
      if oc.ema:
        for k, p in self.p.items():
          self.ema[k] = (1.0 - oc.ema_rate) * p + oc.ema_rate * self.ema[k]
    return carry, loss.detach(), metrics

  def _sign_sgd(self, ids, grad, lr, wd):
    """CastedSparseEmbeddingSignSGD_Distributed with world_size 1."""
    uniq, inverse = ids.unique(return_inverse=True)
    summed = torch.zeros(uniq.shape[0], grad.shape[1], dtype=grad.dtype)
    summed.scatter_add_(0, inverse.unsqueeze(-1).expand(-1, grad.shape[1]),
                        grad)
    rows = self.table[uniq]
    rows.mul_(1.0 - lr * wd).add_(torch.sign(summed), alpha=-lr)
    self.table[uniq] = rows

  def _adam_atan2(self, lr):
    """imoneoi/adam-atan2 reference math: decoupled wd, no epsilon."""
    oc = self.oc
    b1, b2, t = oc.beta1, oc.beta2, self.step
    step_size = lr / (1 - b1 ** t)
    sqrt_bc2 = math.sqrt(1 - b2 ** t)
    for k, p in self.p.items():
      g = p.grad
      p.mul_(1 - lr * oc.weight_decay)
      self.m[k].lerp_(g, 1 - b1)
      self.v[k].lerp_(g.square(), 1 - b2)
      p.add_(torch.atan2(self.m[k], self.v[k].sqrt() / sqrt_bc2),
             alpha=-step_size)
      p.grad = None
