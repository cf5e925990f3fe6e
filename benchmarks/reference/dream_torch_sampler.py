"""The reference masked-diffusion sampler in PyTorch, for side-by-side runs.

Written from the specification of Dream's `DreamGenerationMixin._sample`
(`../shared/specs/dream_diffucoder.md` §2.2): right-pad the prompt with the
mask token, `linspace(1, eps, steps + 1)` timesteps, a full bidirectional
forward per step, the logit shift, `sample_tokens` (temperature, top-p before
top-k, both filling `finfo.min`, softmax, then max or a categorical draw;
`maskgit_plus` / `topk_margin` / `entropy` confidences on the filtered
distribution), the batch-average reveal count `int(n * (1 - s/t))` and the
per-row `topk` of the confidences. Logits stay in the model's dtype.

The model is transformers' `Qwen2ForCausalLM` holding Dream's state_dict
(identical names and shapes), made bidirectional by passing an explicit
4-D boolean mask [B, 1, L, L] as Dream's remote code does (spec §9).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def qwen2_from_hf_dir(directory: str, dtype=torch.float32):
  """A transformers Qwen2 model with the weights of a Dream-layout HF
  directory (as `trm.families.dream.hf_import.export_hf_checkpoint` writes)."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from safetensors.torch import load_file  # pylint: disable=g-import-not-at-top
  with open(os.path.join(directory, "config.json")) as f:
    c = json.load(f)
  config = transformers.Qwen2Config(
      vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
      intermediate_size=c["intermediate_size"],
      num_hidden_layers=c["num_hidden_layers"],
      num_attention_heads=c["num_attention_heads"],
      num_key_value_heads=c["num_key_value_heads"],
      rope_theta=c["rope_theta"], rms_norm_eps=c["rms_norm_eps"],
      max_position_embeddings=c.get("max_position_embeddings", 131072),
      tie_word_embeddings=False, attn_implementation="sdpa")
  model = transformers.Qwen2ForCausalLM(config)
  state = {}
  for name in sorted(os.listdir(directory)):
    if name.endswith(".safetensors"):
      state.update(load_file(os.path.join(directory, name)))
  model.load_state_dict(state, strict=True)
  return model.to(dtype).eval()


def _top_p_logits(logits, top_p):
  sorted_logits, sorted_indices = torch.sort(logits, descending=True)
  cumulative = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
  remove = cumulative > top_p
  remove[..., 1:] = remove[..., :-1].clone()
  remove[..., 0] = False
  mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(
      -1, sorted_indices, remove)
  return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def _top_k_logits(logits, top_k):
  top_k = min(top_k, logits.size(-1))
  kth = torch.topk(logits, top_k)[0][..., -1, None]
  return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def sample_tokens(logits, temperature=0.0, top_p=None, top_k=None,
                  margin_confidence=False, neg_entropy=False):
  if temperature > 0:
    logits = logits / temperature
  if top_p is not None and top_p < 1:
    logits = _top_p_logits(logits, top_p)
  if top_k is not None:
    logits = _top_k_logits(logits, top_k)
  probs = torch.softmax(logits, dim=-1)
  if temperature > 0:
    x0 = torch.distributions.Categorical(probs=probs).sample()
    confidence = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
  else:
    confidence, x0 = probs.max(dim=-1)
  if margin_confidence:
    top = torch.sort(probs, dim=-1, descending=True)[0]
    confidence = top[:, 0] - top[:, 1]
  if neg_entropy:
    confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
  return confidence, x0


@torch.no_grad()
def diffusion_generate(model, input_ids, attention_mask=None, *,
                       mask_token_id: int, max_new_tokens: int, steps: int,
                       eps: float = 1e-3, alg: str = "origin",
                       alg_temp=None, temperature: float = 0.0, top_p=None,
                       top_k=None):
  """sequences [B, P + max_new_tokens] (prompt + canvas), as the reference."""
  input_ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long)
  max_length = input_ids.shape[1] + max_new_tokens
  x = F.pad(input_ids, (0, max_length - input_ids.shape[1]),
            value=mask_token_id)
  b = x.shape[0]
  if attention_mask is not None and bool(
      (torch.as_tensor(np.asarray(attention_mask)) == 0).any()):
    am = F.pad(torch.as_tensor(np.asarray(attention_mask)).long(),
               (0, max_length - input_ids.shape[1]), value=1)
    tok_idx = am.long().cumsum(-1) - 1
    tok_idx.masked_fill_(am == 0, 1)
    am = am.bool()
    mask4 = am[:, None, None, :] & am[:, None, :, None]
  else:
    tok_idx = None
    mask4 = torch.ones(b, 1, max_length, max_length, dtype=torch.bool)
  timesteps = torch.linspace(1, eps, steps + 1)
  for i in range(steps):
    mask_index = x == mask_token_id
    logits = model(input_ids=x, attention_mask=mask4,
                   position_ids=tok_idx).logits
    logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    mask_logits = logits[mask_index]
    t, s = timesteps[i], timesteps[i + 1]
    if alg == "origin":
      p_transfer = 1 - s / t if i < steps - 1 else 1
      x0 = torch.zeros_like(x[mask_index], dtype=torch.long) + mask_token_id
      transfer = torch.rand(*x0.shape) < p_transfer
      _, x0[transfer] = sample_tokens(mask_logits[transfer], temperature,
                                      top_p, top_k)
      x[mask_index] = x0.clone()
      continue
    confidence, x0 = sample_tokens(
        mask_logits, temperature, top_p, top_k,
        margin_confidence=alg == "topk_margin", neg_entropy=alg == "entropy")
    num_mask_token = mask_index.sum() / mask_index.shape[0]
    k = (int(num_mask_token * (1 - s / t)) if i < steps - 1
         else int(num_mask_token))
    full_confidence = torch.full_like(x, -torch.inf, dtype=logits.dtype)
    full_confidence[mask_index] = confidence
    if k > 0:
      if alg_temp is None or alg_temp == 0:
        _, transfer_index = torch.topk(full_confidence, k)
      else:
        weights = F.softmax(full_confidence / alg_temp, dim=-1)
        transfer_index = torch.multinomial(weights, num_samples=k)
      x_ = torch.zeros_like(x, dtype=torch.long) + mask_token_id
      x_[mask_index] = x0.clone()
      rows = torch.arange(b).unsqueeze(1).expand_as(transfer_index)
      x[rows, transfer_index] = x_[rows, transfer_index]
  return x.numpy()
