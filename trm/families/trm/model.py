"""Tiny Recursive Model (TRM), faithful to SamsungSAILMontreal/TinyRecursiveModels.

`TRM` is the inner model: one forward = H_cycles recursion cycles of one
shared network, returning the new (z_H, z_L), token logits and halting logits.
Adaptive computation time (ACT) is plain functions on a `Carry`:
`reset_carry` swaps fresh data into halted rows ("streaming ACT") and
`act_step` runs one supervision step and decides which rows halt.

Variables live in three collections:
  params      trained by AdamATan2 and averaged by the EMA;
  buffers     H_init / L_init, fixed (upstream nn.Buffer);
  puzzle_emb  the puzzle-embedding table, trained by sparse sign-SGD.
"""
from __future__ import annotations

import dataclasses
import math

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from trm.core import mesh as mesh_lib
from trm.families.trm import layers
from trm.families.trm import mlp_gpu
from trm.families.trm import mlp_tpu
from trm.nn import attention as attention_lib
from trm.nn import linear
from trm.nn import tpu_attention

IGNORE_LABEL_ID = -100
# Compute dtypes the family trains in. float16 would need loss scaling,
# which TRM's step does not run (upstream trains in bfloat16).
FORWARD_DTYPES = ("bfloat16", "float32")


def check_forward_dtype(value) -> None:
  """config.model.forward_dtype outside FORWARD_DTYPES: one line naming the
  field (before: 'int8' trained quietly on integer activations)."""
  if value not in FORWARD_DTYPES:
    extra = (" float16 needs loss scaling, which the TRM family does not run."
             if value == "float16" else "")
    raise ValueError(f"config.model.forward_dtype={value!r}: use one of "
                     f"{', '.join(FORWARD_DTYPES)}.{extra}")

_ACT = ("activation_batch", "activation_length", "activation_embed")


@dataclasses.dataclass(frozen=True)
class TRMConfig:
  """Architecture; defaults are upstream `config/arch/trm.yaml`."""
  vocab_size: int
  seq_len: int
  num_puzzle_identifiers: int
  hidden_size: int = 512
  num_heads: int = 8
  expansion: float = 4.0
  L_layers: int = 2
  H_cycles: int = 3
  L_cycles: int = 6
  halt_max_steps: int = 16
  halt_exploration_prob: float = 0.1
  puzzle_emb_ndim: int = 512
  puzzle_emb_len: int = 16
  pos_encodings: str = "rope"  # rope | learned | none
  mlp_t: bool = False
  # The SwiGLU + norm of every block (mlp_t's token mixer and the channel
  # MLP): 'dot' (XLA) | 'pallas' (fused TPU kernels, fewer HBM bytes) |
  # 'pallas_interpret' (those kernels on CPU, for tests) | 'triton'
  # (NVIDIA GPU kernels: mlp_t's token mixer, and the channel MLP where
  # channel_gpu's layout is 'epilogue', which stays XLA's until a GPU run
  # times it) | 'triton_interpret' (those kernels on CPU, for tests).
  mlp_kernel: str = "dot"
  # Attention (mlp_t=False): 'dot' (XLA) | 'splash' (the Pallas kernel of
  # trm.nn.tpu_attention, no scores in HBM) | 'splash_interpret' (CPU) |
  # 'cudnn' (cuDNN flash attention on NVIDIA GPUs, as upstream's
  # FlashAttention: no [B, H, T, T] scores kept for the backward).
  attention: str = "dot"
  rms_norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  forward_dtype: str = "bfloat16"
  no_ACT_continue: bool = True
  remat: bool = False  # recompute each block in the backward pass
  # Python-unrolled recursion, for `trm.aot`'s cost analysis only: XLA
  # counts a loop body once, so the rolled program under-reports its FLOPs
  # and bytes by the trip counts. Same math; a bigger program to compile.
  unroll_loops: bool = False

  def __post_init__(self):
    check_forward_dtype(self.forward_dtype)
    if not self.no_ACT_continue:
      raise ValueError(
          "config.model.no_ACT_continue=False (the HRM-style continue loss) is"
          " not supported; upstream TRM crashes on it too. Use True.")
    if self.pos_encodings not in ("rope", "learned", "none"):
      raise ValueError(f"config.model.pos_encodings={self.pos_encodings!r}: "
                       "use 'rope', 'learned' or 'none'.")
    if self.mlp_kernel not in mlp_tpu.KINDS + mlp_gpu.KINDS:
      raise ValueError(
          f"config.model.mlp_kernel={self.mlp_kernel!r}: use one of "
          f"{', '.join(mlp_tpu.KINDS + mlp_gpu.KINDS)}.")
    kinds = tpu_attention.KINDS + attention_lib.GPU_KINDS
    if self.attention not in kinds:
      raise ValueError(
          f"config.model.attention={self.attention!r}: use one of "
          f"{', '.join(kinds)}.")
    for name in ("vocab_size", "seq_len", "num_puzzle_identifiers",
                 "hidden_size", "num_heads", "H_cycles", "L_cycles",
                 "L_layers", "halt_max_steps"):
      if getattr(self, name) < 1:
        raise ValueError(f"config.model.{name}={getattr(self, name)} must be "
                         ">= 1.")
    for name, zero in (("puzzle_emb_ndim", "no puzzle embedding"),
                       ("puzzle_emb_len", "derived from puzzle_emb_ndim")):
      if getattr(self, name) < 0:
        raise ValueError(f"config.model.{name}={getattr(self, name)} must be "
                         f">= 0 (0: {zero}).")
    if self.puzzle_emb_ndim > self.prefix_len * self.hidden_size:
      # The vector is laid out over the prefix positions; one wider than
      # them failed while tracing with "index can't contain negative
      # values" (upstream's view fails on it too).
      raise ValueError(
          f"config.model.puzzle_emb_ndim={self.puzzle_emb_ndim} does not fit "
          f"the puzzle prefix of puzzle_emb_len={self.puzzle_emb_len} x "
          f"hidden_size={self.hidden_size} values: raise puzzle_emb_len to "
          f">= {-(self.puzzle_emb_ndim // -self.hidden_size)}, or set it to 0 "
          "(as many positions as the vector needs).")
    # Float knobs: a NaN compares False with everything, so test the range
    # the right way round.
    if not 0.0 <= self.halt_exploration_prob <= 1.0:
      raise ValueError("config.model.halt_exploration_prob="
                       f"{self.halt_exploration_prob} must be in [0, 1].")
    for name in ("expansion", "rope_theta"):
      value = getattr(self, name)
      if not (math.isfinite(value) and value > 0):
        raise ValueError(f"config.model.{name}={value} must be a finite "
                         "number > 0.")
    if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps >= 0):
      raise ValueError(f"config.model.rms_norm_eps={self.rms_norm_eps} must "
                       "be a finite number >= 0.")
    if layers.swiglu_width(self.hidden_size, self.expansion) < 1:
      raise ValueError(
          f"config.model.expansion={self.expansion} gives the SwiGLU no "
          f"inner width at hidden_size={self.hidden_size}; raise it.")
    if self.attention == "cudnn" and not self.mlp_t:
      attention_lib.check_cudnn_config(
          dtype=self.forward_dtype,
          head_dim=self.hidden_size // max(self.num_heads, 1),
          dtype_field="forward_dtype")
    if self.mlp_t:
      return  # no attention: num_heads is unused, as upstream's MLP-t runs
    if self.hidden_size % self.num_heads:
      raise ValueError(f"config.model.hidden_size={self.hidden_size} must be "
                       f"divisible by num_heads={self.num_heads}.")
    head_dim = self.hidden_size // self.num_heads
    if self.pos_encodings == "rope" and head_dim % 2:
      # Rotate-half RoPE pairs the two halves of each head: an odd head
      # failed while tracing with a broadcasting error (upstream too).
      raise ValueError(
          f"config.model.hidden_size / num_heads (the head dim, {head_dim}) "
          "must be even for pos_encodings='rope': change hidden_size or "
          "num_heads, or use pos_encodings='learned' or 'none'.")

  @property
  def prefix_len(self) -> int:
    """Number of puzzle-embedding positions in front of the tokens."""
    if self.puzzle_emb_ndim <= 0:
      return 0
    if self.puzzle_emb_len == 0:  # HRM behaviour
      return -(self.puzzle_emb_ndim // -self.hidden_size)
    return self.puzzle_emb_len

  @property
  def total_len(self) -> int:
    return self.seq_len + self.prefix_len

  @property
  def dtype(self):
    return jnp.dtype(self.forward_dtype)


@flax.struct.dataclass
class Carry:
  """Per-row state that persists across train steps (sharded on the batch)."""
  z_H: jax.Array            # [B, S, D] forward dtype
  z_L: jax.Array            # [B, S, D]
  steps: jax.Array          # [B] int32, ACT steps taken on the current data
  halted: jax.Array         # [B] bool, row takes new data at the next step
  inputs: jax.Array         # [B, L] int32, the data the row works on
  labels: jax.Array         # [B, L] int32, IGNORE_LABEL_ID where unsupervised
  puzzle_identifiers: jax.Array  # [B] int32

  @property
  def batch(self):
    return {"inputs": self.inputs, "labels": self.labels,
            "puzzle_identifiers": self.puzzle_identifiers}


CARRY_AXES = Carry(
    z_H=_ACT, z_L=_ACT, steps=("activation_batch",),
    halted=("activation_batch",),
    inputs=("activation_batch", "activation_length"),
    labels=("activation_batch", "activation_length"),
    puzzle_identifiers=("activation_batch",))


_SEQ_MAJOR = ("activation_length", "activation_batch", "activation_embed")


class Block(nn.Module):
  """Post-norm block: attention (or token-mixing MLP), then SwiGLU.

  With `seq_major` (mlp_t only) activations are [S, B, D] instead of
  [B, S, D]: the token mixer and its norm over tokens then act on axis 0 of
  an [S, B*D] matrix and the channel MLP on an [S*B, D] one, so no
  activation is ever transposed.
  """
  cfg: TRMConfig
  seq_major: bool = False

  @nn.compact
  def __call__(self, h, rope):
    cfg = self.cfg
    if cfg.mlp_t:
      if not self.seq_major:
        h = jnp.swapaxes(h, 0, 1)
      # Token mixing: the MLP and its RMSNorm act over tokens.
      h = layers.SwiGLUNorm(cfg.total_len, cfg.expansion, cfg.dtype,
                            cfg.rms_norm_eps, axes=("token", "token_mlp"),
                            tokens=True, kernel=cfg.mlp_kernel,
                            batch_axis=1, name="mlp_t")(h)
      h = mesh_lib.constrain(h, _SEQ_MAJOR)
    else:
      h = layers.rms_norm(
          h + layers.Attention(cfg.hidden_size, cfg.num_heads, cfg.num_heads,
                               cfg.dtype, cfg.attention,
                               name="self_attn")(h, rope),
          cfg.rms_norm_eps)
      h = mesh_lib.constrain(h, _ACT)
    h = layers.SwiGLUNorm(cfg.hidden_size, cfg.expansion, cfg.dtype,
                          cfg.rms_norm_eps, kernel=cfg.mlp_kernel,
                          batch_axis=1 if cfg.mlp_t else 0, name="mlp")(h)
    if cfg.mlp_t and not self.seq_major:
      h = jnp.swapaxes(h, 0, 1)
    return mesh_lib.constrain(h, _SEQ_MAJOR if self.seq_major else _ACT)


class ReasoningNet(nn.Module):
  """The one shared network: net(h, injection) = blocks(h + injection)."""
  cfg: TRMConfig
  seq_major: bool = False  # activations [S, B, D] (see Block)

  @nn.compact
  def __call__(self, h, injection, rope):
    h = h + injection
    block = nn.remat(Block) if self.cfg.remat else Block
    for i in range(self.cfg.L_layers):
      h = block(self.cfg, self.seq_major, name=f"layers_{i}")(h, rope)
    return h


class TRM(nn.Module):
  """Inner TRM: embeddings, recursion, heads."""
  cfg: TRMConfig

  def setup(self):
    cfg = self.cfg
    d = cfg.hidden_size
    self.embed_tokens = layers.Embed(cfg.vocab_size, d, 1.0 / math.sqrt(d),
                                     dtype=cfg.dtype)
    self.lm_head = layers.Linear(cfg.vocab_size, ("embed", "vocab"),
                                 dtype=cfg.dtype)
    self.q_head = layers.Linear(
        2, ("embed", None), use_bias=True, dtype=cfg.dtype,
        kernel_init=nn.initializers.zeros,
        bias_init=nn.initializers.constant(-5.0))
    if cfg.pos_encodings == "learned":
      self.embed_pos = linear.logical_param(
          self, "embed_pos", layers.trunc_normal(1.0 / math.sqrt(d)),
          ("token", "embed"), (cfg.total_len, d), jnp.float32)
    self.L_level = ReasoningNet(cfg, seq_major=cfg.mlp_t)
    init_state = nn.with_logical_partitioning(
        lambda key: layers.trunc_normal(1.0)(key, (d,)).astype(cfg.dtype),
        ("embed",))
    self.H_init = self.variable("buffers", "H_init", init_state,
                                self.make_rng("params")
                                if self.is_initializing() else None)
    self.L_init = self.variable("buffers", "L_init", init_state,
                                self.make_rng("params")
                                if self.is_initializing() else None)
    if cfg.puzzle_emb_ndim > 0:
      self.puzzle_table = self.variable(
          "puzzle_emb", "weights",
          nn.with_logical_partitioning(nn.initializers.zeros,
                                       ("puzzle", "puzzle_embed")),
          None, (cfg.num_puzzle_identifiers, cfg.puzzle_emb_ndim), jnp.float32)

  def initial_z(self, batch_size: int):
    """(z_H, z_L) reset values broadcast to [B, S, D]."""
    shape = (batch_size, self.cfg.total_len, self.cfg.hidden_size)
    return (jnp.broadcast_to(self.H_init.value, shape),
            jnp.broadcast_to(self.L_init.value, shape))

  def lookup_puzzle(self, puzzle_identifiers):
    return jnp.take(self.puzzle_table.value, puzzle_identifiers, axis=0)

  def _input_embeddings(self, inputs, puzzle_vectors):
    cfg = self.cfg
    x = self.embed_tokens(inputs)
    if cfg.puzzle_emb_ndim > 0:
      pad = cfg.prefix_len * cfg.hidden_size - cfg.puzzle_emb_ndim
      prefix = jnp.pad(puzzle_vectors.astype(cfg.dtype), ((0, 0), (0, pad)))
      prefix = prefix.reshape(inputs.shape[0], cfg.prefix_len, cfg.hidden_size)
      x = jnp.concatenate([prefix, x], axis=1)
    if cfg.pos_encodings == "learned":
      # 1/sqrt(2) keeps the variance of the sum as upstream.
      x = 0.707106781 * (x + self.embed_pos.astype(cfg.dtype))
    return mesh_lib.constrain(math.sqrt(cfg.hidden_size) * x, _ACT)

  def __call__(self, z_H, z_L, inputs, puzzle_vectors):
    """One inner forward. Gradients flow through the last H cycle only.

    `puzzle_vectors` [B, puzzle_emb_ndim] are the looked-up puzzle embeddings
    (see `lookup_puzzle`); the trainer passes them in to differentiate them.
    """
    cfg = self.cfg
    x = self._input_embeddings(inputs, puzzle_vectors)
    if cfg.mlp_t:  # the recursion runs sequence-major (see Block)
      x, z_H, z_L = (jnp.swapaxes(a, 0, 1) for a in (x, z_H, z_L))
    rope = (layers.rope_tables(cfg.total_len, cfg.hidden_size // cfg.num_heads,
                               cfg.rope_theta)
            if cfg.pos_encodings == "rope" and not cfg.mlp_t else None)

    def h_cycle(net, z_H, z_L, x, inner_loop):
      def l_step(_, z_L):
        return net(z_L, z_H + x)
      if inner_loop and not cfg.unroll_loops:
        z_L = jax.lax.fori_loop(0, cfg.L_cycles, l_step, z_L)
      else:
        for i in range(cfg.L_cycles):
          z_L = l_step(i, z_L)
      return net(z_H, z_L), z_L

    if cfg.H_cycles > 1 and not self.is_initializing():
      # The first H_cycles-1 cycles carry no gradient. Running them on
      # stop-gradient copies of the weights and input inside loops keeps the
      # program (and compile time) the size of one cycle, and reverse-mode
      # differentiation never sees the loops.
      frozen = jax.lax.stop_gradient(self.L_level.variables)
      x_frozen = jax.lax.stop_gradient(x)
      free_net = ReasoningNet(cfg, cfg.mlp_t, parent=None)  # unbound: a pure function
      frozen_net = lambda h, inj: free_net.apply(frozen, h, inj, rope)
      frozen_cycle = lambda _, z: h_cycle(  # noqa: E731
          frozen_net, *z, x_frozen, inner_loop=True)
      z = (jax.lax.stop_gradient(z_H), jax.lax.stop_gradient(z_L))
      if cfg.unroll_loops:
        for i in range(cfg.H_cycles - 1):
          z = frozen_cycle(i, z)
      else:
        z = jax.lax.fori_loop(0, cfg.H_cycles - 1, frozen_cycle, z)
      z_H, z_L = z
    net = lambda h, inj: self.L_level(h, inj, rope)
    z_H, z_L = h_cycle(net, z_H, z_L, x, inner_loop=False)
    if cfg.mlp_t:
      z_H, z_L = jnp.swapaxes(z_H, 0, 1), jnp.swapaxes(z_L, 0, 1)
    logits = self.lm_head(z_H)[:, cfg.prefix_len:]
    q_logits = self.q_head(z_H[:, 0]).astype(jnp.float32)
    return z_H, z_L, logits, q_logits[..., 0], q_logits[..., 1]


def init_variables(model: TRM, rng, batch_size: int = 1):
  """Boxed variables of all collections (use under jax.eval_shape / jit)."""
  cfg = model.cfg
  z = jnp.zeros((batch_size, cfg.total_len, cfg.hidden_size), cfg.dtype)
  inputs = jnp.zeros((batch_size, cfg.seq_len), jnp.int32)
  vectors = jnp.zeros((batch_size, max(cfg.puzzle_emb_ndim, 1)), jnp.float32)
  return model.init({"params": rng}, z, z, inputs,
                    vectors if cfg.puzzle_emb_ndim > 0 else None)


def empty_carry(cfg: TRMConfig, batch_size: int) -> Carry:
  """All rows halted, so the first step loads data into every row."""
  z = jnp.zeros((batch_size, cfg.total_len, cfg.hidden_size), cfg.dtype)
  tokens = jnp.zeros((batch_size, cfg.seq_len), jnp.int32)
  return Carry(z_H=z, z_L=z, steps=jnp.zeros((batch_size,), jnp.int32),
               halted=jnp.ones((batch_size,), bool), inputs=tokens,
               labels=jnp.full_like(tokens, IGNORE_LABEL_ID),
               puzzle_identifiers=jnp.zeros((batch_size,), jnp.int32))


def reset_carry(model: TRM, variables, carry: Carry, batch) -> Carry:
  """Halted rows restart from (H_init, L_init) on the new batch's rows."""
  h0, l0 = model.apply(variables, carry.z_H.shape[0], method=TRM.initial_z)
  halted = carry.halted

  def pick(new, old):
    return jnp.where(halted.reshape(halted.shape + (1,) * (old.ndim - 1)),
                     new, old)

  return Carry(z_H=pick(h0, carry.z_H), z_L=pick(l0, carry.z_L),
               steps=jnp.where(halted, 0, carry.steps), halted=halted,
               inputs=pick(batch["inputs"], carry.inputs),
               labels=pick(batch["labels"], carry.labels),
               puzzle_identifiers=pick(batch["puzzle_identifiers"],
                                       carry.puzzle_identifiers))


def exploration_min_halt(cfg: TRMConfig, rng, rows: int) -> jax.Array:
  """[rows] int32: the step before which exploration keeps each row going
  (0 for the rows that do not explore)."""
  explore_key, steps_key = jax.random.split(rng)
  explore = jax.random.uniform(explore_key, (rows,)) < cfg.halt_exploration_prob
  return explore * jax.random.randint(steps_key, (rows,), 2,
                                      cfg.halt_max_steps + 1)


def act_step(model: TRM, variables, carry: Carry, puzzle_vectors, *,
             train: bool, rng=None, min_halt=None):
  """One supervision step on a reset carry.

  Returns (new_carry, outputs) with outputs = {logits, q_halt_logits,
  q_continue_logits}. In training a row halts when it reached halt_max_steps
  or q_halt > 0, unless exploration holds it until a random minimum step
  (`min_halt`, else drawn from `rng` by `exploration_min_halt`); in
  evaluation every row runs exactly halt_max_steps steps.
  """
  cfg = model.cfg
  z_H, z_L, logits, q_halt, q_continue = model.apply(
      variables, carry.z_H, carry.z_L, carry.inputs, puzzle_vectors)
  steps = carry.steps + 1
  halted = steps >= cfg.halt_max_steps
  if train and cfg.halt_max_steps > 1:
    q = jax.lax.stop_gradient(q_halt)
    halted = halted | (q > 0)
    if min_halt is None:
      min_halt = exploration_min_halt(cfg, rng, steps.shape[0])
    halted = halted & (steps >= min_halt)
  new_carry = carry.replace(z_H=jax.lax.stop_gradient(z_H),
                            z_L=jax.lax.stop_gradient(z_L),
                            steps=steps, halted=halted)
  return new_carry, {"logits": logits, "q_halt_logits": q_halt,
                     "q_continue_logits": q_continue}


def net_call_flops(cfg: TRMConfig) -> int:
  """Matmul FLOPs of one application of the shared network, per example."""
  s, d = cfg.total_len, cfg.hidden_size
  block = 6 * s * d * layers.swiglu_width(d, cfg.expansion)  # channel SwiGLU
  if cfg.mlp_t:
    block += 6 * d * s * layers.swiglu_width(s, cfg.expansion)  # token SwiGLU
  else:
    block += 8 * s * d * d + 4 * s * s * d  # q,k,v,o projections; scores, AV
  return cfg.L_layers * block


def train_flops_per_example(cfg: TRMConfig) -> int:
  """Model FLOPs of one train step per example (recomputation not counted).

  Forward: H_cycles * (L_cycles + 1) network calls and the LM head; backward
  (twice the forward) through the last L_cycles + 1 calls and the head only.
  """
  calls_forward = cfg.H_cycles * (cfg.L_cycles + 1)
  calls_backward = 2 * (cfg.L_cycles + 1)
  head = 6 * cfg.seq_len * cfg.hidden_size * cfg.vocab_size
  return net_call_flops(cfg) * (calls_forward + calls_backward) + head
