"""Remat policies by name, as MaxText's `remat_policy`, for any family.

'full' saves nothing a block computes (its input is what a scanned stack
keeps); 'minimal' saves the outputs of the matmuls with weights (MaxText's
minimal: jax's dots without batch dimensions) and recomputes attention's
batched dots and the elementwise work; 'custom' keeps in HBM the tensors
named in `remat_save`, moves those in `remat_offload` to the host's memory
(and back for the backward pass), and recomputes the rest. A family tags
the tensors with `jax.ad_checkpoint.checkpoint_name` under these names.
"""
from __future__ import annotations

from typing import Sequence

import jax

POLICIES = ("full", "minimal", "custom")
# Each weight matmul's output, which 'minimal' saves (tagged by name, since
# a custom_vjp matmul hides its dot from jax's dot-saving policies).
WEIGHT_MATMUL = "weight_matmul"
# MaxText's names: a block's input (the residual stream a scanned stack
# keeps per layer), attention's projections after their reshape to heads,
# its output projection's output, the MLP's input projections' outputs
# (before the activation; a gated MLP tags gate and up alike, as MaxText's
# fused `mlpwi`) and its output projection's.
LAYER_INPUT = "decoder_layer_input"
QKV_NAMES = ("query_proj", "key_proj", "value_proj")
OUT_PROJ = "out_proj"
MLP_IN = "mlpwi"
MLP_OUT = "mlpwo"
NAMES = ((LAYER_INPUT,) + QKV_NAMES + (OUT_PROJ, MLP_IN, MLP_OUT)
         + (WEIGHT_MATMUL,))


def names(value, field: str) -> tuple[str, ...]:
  """`config.model.<field>` (a comma-separated string) as a tuple."""
  if not isinstance(value, str):
    raise ValueError(f"config.model.{field}={value!r} must be a string of "
                     f"comma-separated names from {NAMES}.")
  return tuple(n.strip() for n in value.split(",") if n.strip())


def check(policy: str, save: str, offload: str,
          policy_field: str = "remat_policy",
          policies: Sequence[str] = POLICIES) -> None:
  """Refuses an unknown policy or name, names given to a policy other than
  'custom', and a name both kept and offloaded; each error names its
  field."""
  if policy not in policies:
    raise ValueError(f"config.model.{policy_field}={policy!r} must be one of "
                     f"{tuple(policies)}.")
  saved, offloaded = names(save, "remat_save"), names(offload, "remat_offload")
  for field, value, given in (("remat_save", save, saved),
                              ("remat_offload", offload, offloaded)):
    unknown = [n for n in given if n not in NAMES]
    if unknown:
      raise ValueError(f"config.model.{field}: unknown {unknown}; choose "
                       f"from {NAMES}.")
    if given and policy != "custom":
      raise ValueError(f"config.model.{field}={value!r} is read only with "
                       f"config.model.{policy_field}='custom' (it is "
                       f"{policy!r}): set the policy, or leave the field "
                       "empty.")
  both = sorted(set(saved) & set(offloaded))
  if both:
    raise ValueError(f"config.model.remat_save and remat_offload both name "
                     f"{both}: a tensor is kept in HBM or moved to the host, "
                     "not both.")


def checkpoint_policy(policy: str, save: str = "", offload: str = ""):
  """jax.checkpoint's policy for a checked `policy` (None: save nothing)."""
  if policy == "minimal":
    return jax.checkpoint_policies.save_only_these_names(WEIGHT_MATMUL)
  if policy == "custom":
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=list(names(save, "remat_save")),
        names_which_can_be_offloaded=list(names(offload, "remat_offload")),
        offload_src="device", offload_dst="pinned_host")
  return None
