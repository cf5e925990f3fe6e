"""GPT as nanoGPT trains it, on the sharded trainer.

  --config=configs/gpt.py                       nanoGPT train.py defaults
                                                (GPT-2 124M shapes, bias off)
  --config=configs/gpt.py:shakespeare_char      config/train_shakespeare_char.py
  --config=configs/gpt.py:shakespeare_char_cpu  the README's CPU recipe
  --config=configs/gpt.py:gpt2 | gpt2-medium | gpt2-large | gpt2-xl
                                                GPT-2 shapes (vocab 50257,
                                                block 1024, bias on)
  --config=configs/gpt.py:maxtext22b            MaxText's 22B v4 benchmark as
                                                measured (README "Runtime
                                                Performance Results"): 48 x
                                                6144, 24 heads, MLP 24576,
                                                sequence 1024, vocab 32768,
                                                16 sequences per chip of a
                                                v4-128, full remat, FSDP 64
  --config=configs/gpt.py:maxtext22b,seq2048    the same at sequence 2048
                                                (MaxText's later 22b.sh), with
                                                splash attention and 12
                                                sequences per chip
  --config=configs/gpt.py:maxtext52b            MaxText's 52B v4 benchmark:
                                                32 x 12288, 32 heads of 256,
                                                MLP 49152, sequence 1024, 10
                                                sequences per chip of a
                                                v4-384, full remat, FSDP 192
  --config=configs/gpt.py:maxtext16b | maxtext32b | maxtext64b | maxtext128b
                                                MaxText's v5e-256 benchmarks
                                                (v5e_high_performance.md):
                                                sequence 2048, flash (splash)
                                                attention, its XLA flags
  --config=configs/gpt.py:v5p32b | v5p64b | v5p128b | v5p256b | v5p512b |
      v5p1024b                                  MaxText's v5p benchmarks
                                                (configs/v5p/README.md):
                                                the same decoders on FSDP x
                                                tensor, remat minimal to 256B

nanoGPT's flag names are the config keys (`--config.n_layer=4`,
`--config.max_iters=2000`, ...); the trainer's own keys (`total_steps`,
`eval_every`, ...) follow them through FieldReferences, so setting either
name works. Two differences from nanoGPT: `batch_size` is the micro-batch
over the whole mesh (nanoGPT's is per GPU), and `--workdir` replaces
`out_dir`.
"""
import ml_collections

from trm.core import config_lib
from trm.core import tpu_flags

_GPT2_SIZES = {  # n_layer, n_head, n_embd (nanoGPT's from_pretrained table)
    "gpt2": (12, 12, 768),
    "gpt2-medium": (24, 16, 1024),
    "gpt2-large": (36, 20, 1280),
    "gpt2-xl": (48, 25, 1600),
}
# MaxText's v5e runs: n_layer, n_head, n_embd, mlp_dim, per_device_batch_size,
# ici_tensor_parallelism (pyconfig.get_individual_scales of scale 16 .. 128).
_MAXTEXT_V5E = {
    "maxtext16b": (32, 32, 5120, 32768, 6, 1),
    "maxtext32b": (32, 32, 10240, 32768, 4, 1),
    "maxtext64b": (64, 32, 10240, 32768, 2, 1),
    "maxtext128b": (64, 64, 10240, 65536, 1, 16),
}
# MaxText's v5p runs (configs/v5p/<size>.sh and README.md, commit 76bd53b0f,
# 2023-12-15; the same base.yml as the v5e runs): n_layer, n_head, n_embd,
# mlp_dim, per_device_batch_size, ici_tensor_parallelism, remat_policy,
# chips of the first published slice (v5p-N has N/2 chips). XLA:TPU
# (libtpu 0.0.42.1) refuses v5p64b's "minimal" (95.87G of temporaries for
# 95.74); keeping all but the MLP's input projection compiles it:
# --config.model.remat_policy=custom
# --config.model.remat_save=query_proj,key_proj,value_proj,out_proj,mlpwo
# (BUILD_NOTES "Session 93"; v5p256b's 2-slice step, refused until session
# 97, compiles as it is since: tpu_flags.COLLECTIVE_MATMUL_USERS).
_MAXTEXT_V5P = {
    "v5p32b": (32, 32, 10240, 32768, 8, 4, "minimal", 64),
    "v5p64b": (64, 32, 10240, 32768, 4, 4, "minimal", 64),
    "v5p128b": (64, 64, 10240, 65536, 2, 8, "minimal", 128),
    "v5p256b": (64, 64, 20480, 65536, 2, 8, "minimal", 512),
    "v5p512b": (128, 64, 20480, 65536, 2, 16, "full", 512),
    "v5p1024b": (128, 128, 20480, 131072, 2, 16, "full", 1024),
}
_MAXTEXT_V5P_FLAGS = (
    "--xla_tpu_megacore_fusion_allow_ags=false "
    "--xla_enable_async_collective_permute=true "
    "--xla_tpu_enable_ag_backward_pipelining=true "
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true "
    "--xla_tpu_data_parallel_opt_different_sized_ops=true "
    "--xla_tpu_enable_async_collective_fusion=true "
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
    "--xla_tpu_overlap_compute_collective_tc=true "
    "--xla_enable_async_all_gather=true")
# Their LIBTPU_INIT_ARGS (the same in all four scripts).
_MAXTEXT_V5E_FLAGS = (
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true "
    "--xla_tpu_data_parallel_opt_different_sized_ops=true "
    "--xla_tpu_enable_async_collective_fusion=true "
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
    "--xla_tpu_overlap_compute_collective_tc=true "
    "--xla_enable_async_all_gather=true")


def get_config(arg=None):
  variants = config_lib.parse_variants(
      arg, {"shakespeare_char", "shakespeare_char_cpu", "maxtext22b",
            "maxtext52b", "seq2048", *_GPT2_SIZES, *_MAXTEXT_V5E,
            *_MAXTEXT_V5P})
  if "seq2048" in variants and "maxtext22b" not in variants:
    raise ValueError("configs/gpt.py:seq2048 goes with maxtext22b: "
                     "--config=configs/gpt.py:maxtext22b,seq2048.")
  if len(variants - {"seq2048"}) > 1:
    raise ValueError(f"Choose one variant of configs/gpt.py, not "
                     f"{sorted(variants)}.")
  c = ml_collections.ConfigDict()

  # I/O (nanoGPT names).
  c.eval_interval = 2000        # evaluate (and maybe checkpoint) every N iters
  c.log_interval = 1            # train-metric cadence in iterations
  c.metrics_jsonl = True        # also WORKDIR/metrics.jsonl: one JSON object
                                # per write (step, metrics; NaN/Inf null)
  c.eval_iters = 200            # batches per split in estimate_loss
  c.eval_only = False           # evaluate the restored model, then exit
  c.eval_at_start = True        # evaluate the starting weights first (step
                                # 0 or an imported iteration), as nanoGPT's
                                # iter 0; not saved (the trainer's default,
                                # for the other models, is False)
  c.compiled_step = ""         # file of trm.aot --save_compiled ('': compile)
  c.always_save_checkpoint = True  # False: save only when val loss improves
  c.init_from = "scratch"       # scratch | resume | gpt2 | gpt2-medium | ...
  c.init_checkpoint = ""        # HF GPT-2 dir (init_from=gpt2*) or a nanoGPT
                                # ckpt.pt to start from; '' = none
  # Data.
  c.dataset = "openwebtext"     # name: data lives in data_root/<dataset>
  c.data_root = "data"          # parent of the prepared dataset directories
  c.gradient_accumulation_steps = 40  # micro-batches per iteration
  c.batch_size = 12             # sequences per micro-batch (whole mesh)
  c.block_size = 1024           # context length in tokens
  # Model.
  c.n_layer = 12                # transformer blocks
  c.n_head = 12                 # attention heads
  c.n_embd = 768                # width
  c.dropout = 0.0               # dropout rate (0.0 for pretraining)
  c.bias = False                # biases in Linear and LayerNorm layers
  # Optimizer (nanoGPT's AdamW).
  c.optimizer = "adamw"         # or adam_atan2 | adafactor | lion | sgd
                                # (momentum beta1): same schedule, clipping
                                # and decay groups; nanoGPT's ckpt.pt (export,
                                # init_from='resume') holds AdamW's state only
  c.learning_rate = 6e-4        # peak learning rate (float)
  c.max_iters = 600000          # training iterations
  c.weight_decay = 1e-1         # decoupled, on 2-D weights only (float)
  c.beta1 = 0.9                 # AdamW beta1 (float)
  c.beta2 = 0.95                # AdamW beta2 (float)
  c.grad_clip = 1.0             # global-norm clip; 0.0 disables (float)
  c.lr_mults = ()               # ((regex, mult), ..): first full match of a
                                # '/'-joined param name scales its update
                                # (0 freezes it)
  c.wd_mults = ()               # same pairs, scaling its weight decay
  # Learning-rate schedule.
  c.decay_lr = True             # warmup + cosine; False: constant rate
  c.warmup_iters = 2000         # linear warmup iterations
  c.warmup_ratio = 0.0          # > 0: warm up over ceil(ratio x max_iters)
                                # iterations instead (HF's; warmup_iters=0)
  c.lr_decay_iters = 600000     # cosine reaches min_lr here (~= max_iters)
  c.min_lr = 6e-5               # final learning rate (~= learning_rate/10)
  # System.
  c.dtype = "bfloat16"          # compute dtype: float32 | bfloat16 | float16
                                # (float16: with dynamic loss scaling)
  c.seed = 1337                 # init, data and dropout randomness
  c.data_seed = -1              # the data's own seed (the windows drawn for
                                # training and estimate_loss); -1: seed (HF's
                                # data_seed, MaxText's data_shuffle_seed)
  c.loss_chunk_size = 0         # positions whose logits exist at once in the
                                # loss (0: all of them, as nanoGPT)
  c.loss_reduce_once = False    # chunked loss: sum the head's gradient over
                                # the batch devices once, not per chunk
                                # (+vocab x n_embd x 4 bytes per device)
  c.label_smoothing = 0.0       # the loss's target: (1 - s) one-hot +
                                # s / vocab (torch's label_smoothing, HF's
                                # label_smoothing_factor); 0: nanoGPT's
  c.z_loss = 0.0                # adds z * mean(logsumexp(logits)**2) to the
                                # loss (MaxText's z_loss_multiplier), logged
                                # alone as train/z_loss; estimate_loss scores
                                # both terms, plus eval/*_cross_entropy
  c.loss_kernel = "xla"         # the loss's passes over the logits: xla |
                                # triton (NVIDIA GPUs: one Pallas kernel
                                # writes their gradient in place)
  # Weights & Biases (nanoGPT's names for config.wandb's fields).
  c.wandb_log = False           # also log metrics to W&B (.[wandb] extra)
  c.wandb_project = "owt"       # W&B project
  c.wandb_run_name = "gpt2"     # W&B run name

  c.data = ml_collections.ConfigDict(dict(
      source="bin",             # bin: data_root/<dataset> .bin files |
                                # tfds: the TFDS splits of data.tfds |
                                # synthetic: hashed ids, no data (step
                                # benchmarks, MaxText's dataset_type)
      input="",                 # text file or URL to prepare into data_root/
                                # <dataset> when that is not prepared yet
      tokenizer="char",         # preparation: char | gpt2 | tokenizer.json
      # rows per eval batch; follows batch_size (`* 1`: setting it leaves
      # batch_size alone, where a bare reference would set both)
      eval_batch_size=c.get_ref("batch_size") * 1,
      prefetch=2,               # batches Grain prepares ahead
      tfds=ml_collections.ConfigDict(dict(  # data.source='tfds' (README)
          name="trm_tiny_shakespeare",  # TFDS dataset[/config][:version]
          data_dir="",          # its `tfds build --data_dir`; '' = TFDS's
                                # default (~/tensorflow_datasets)
          split="train",        # training windows (and estimate_loss train)
          eval_split="validation",  # estimate_loss's val split
          feature="tokens",     # feature of token-id records (one stream)
      )),
  ))
  c.model = ml_collections.ConfigDict(dict(
      name="gpt",               # model family, see trm/families/__init__.py
      n_layer=c.get_ref("n_layer"),
      n_head=c.get_ref("n_head"),
      n_embd=c.get_ref("n_embd"),
      block_size=c.get_ref("block_size"),
      dropout=c.get_ref("dropout"),
      bias=c.get_ref("bias"),
      dtype=c.get_ref("dtype"),
      vocab_size=0,             # 0: the dataset's meta.json (nanoGPT's
                                # meta.pkl; neither: 50304)
      param_dtype="float32",    # stored parameters (AdamW needs float32)
      remat=False,              # recompute blocks in the backward pass
      remat_policy="full",      # with remat, what a block saves: full
                                # (nothing) | minimal (its weight matmuls'
                                # outputs, MaxText's remat_policy=minimal)
                                # | custom (the two fields below)
      remat_save="",            # custom: comma-separated names kept in HBM
                                # (decoder_layer_input, query_proj,
                                # key_proj, value_proj, out_proj, mlpwi,
                                # mlpwo, weight_matmul)
      remat_offload="",         # custom: names moved to host memory and
                                # back for the backward pass
      scan_layers=False,        # one scanned block, params [n_layer, ...]
      residual_dtype="float32",  # residual stream: float32 (torch autocast)
                                # or the compute dtype (MaxText)
      logits_dtype="float32",   # LM head output: float32, or bfloat16 as
                                # nanoGPT's under torch.autocast
      attention="dot",          # dot | splash (Pallas TPU kernel, block
                                # size % 128 == 0, dropout 0) | cudnn (GPU)
      splash_block=0,           # splash tile along the sequence; 0: the
                                # largest of 512/256/128 dividing block_size
      qkv_projection="auto",    # c_attn: fused | grouped (columns per kv
                                # head: a tensor split on head boundaries,
                                # BUILD_NOTES "Session 98") | separate
                                # (three matmuls) | auto (separate with
                                # cudnn, grouped with heads split, else fused)
      norm_kernel="xla",        # residual adds + LayerNorms: xla | triton
                                # (NVIDIA GPUs: one Pallas kernel each)
      head_size=0,              # per-head width; 0: n_embd // n_head (as
                                # nanoGPT); MaxText's head_dim otherwise
      mlp_size=0,               # MLP hidden width; 0: 4 * n_embd (as
                                # nanoGPT); MaxText's mlp_dim otherwise
      n_kv_head=0,              # key/value heads; 0: n_head (as nanoGPT);
                                # fewer: grouped-query (MaxText's
                                # num_kv_heads), dividing n_head
      head_gather="param",      # LM head's FSDP table gather: param (the
                                # float32 table, then cast) | compute (cast
                                # each shard, gather bf16)
  ))

  # The trainer's keys, tied to nanoGPT's.
  c.total_steps = c.get_ref("max_iters")
  c.eval_every = c.get_ref("eval_interval")
  # Follows eval_interval (nanoGPT saves when it evaluates); set apart, it
  # leaves eval_interval alone.
  c.checkpoint_every = c.get_ref("eval_interval") * 1
  c.log_every = c.get_ref("log_interval")
  c.profiler_steps = 0          # train steps traced by jax.profiler into
                                # <workdir>/plugins/profile (0: none)
  c.skip_first_n_steps_for_profiler = 1  # steps of each run (and resume)
                                # before the trace: compile, warm-up
  c.global_batch_size = (c.get_ref("batch_size")
                         * c.get_ref("gradient_accumulation_steps"))
  c.keep_checkpoints = 2        # newest checkpoints kept on disk
  c.keep_checkpoint_every = 0   # also keep, for good, every step that is a
                                # multiple of N (0: none; big_vision's
                                # keep_ckpt_steps)
  c.max_consecutive_bad_steps = 10  # NaN/Inf steps in a row to stop (0: never)
  c.num_epochs = 0.0            # > 0: max_iters derived from the data, this
                                # many passes over the training tokens
                                # (HF's num_train_epochs; 0: max_iters as set)
  c.resume_step = 0             # resume from this saved step; the newer
                                # ones move to checkpoints_abandoned/ (0:
                                # the newest; HF's resume_from_checkpoint)
  c.early_stopping_patience = 0  # stop after N evaluations in a row with
                                # no eval loss improvement (0: never; HF's)
  c.early_stopping_threshold = 0.0  # the improvement that counts (HF's)
  c.best_metric = "eval/loss"  # the eval metric that ranks checkpoints
                                # (keep-N's best, --step=best) and early
                                # stopping (HF's metric_for_best_model)
  c.best_metric_mode = "auto"  # min | max | auto (min for a loss, max
                                # for an accuracy; HF's greater_is_better)
  c.allow_config_change = False  # resume although model/optim/data/seed/batch
                                # differ from the run's config.json
  c.mesh = config_lib.mesh_config(data=-1, fsdp=1, model=1)
  c.loss_scale = config_lib.loss_scale_config()  # float16 compute only
  c.wandb = config_lib.wandb_config(enabled=c.get_ref("wandb_log"),
                                    project=c.get_ref("wandb_project"),
                                    name=c.get_ref("wandb_run_name"))
  c.logical_axis_rules = config_lib.default_logical_axis_rules()
  c.reduce_gradients_once = True  # gradients cross `data` once per step
                                # (False: GSPMD's, per use and micro-step)
  c.tpu_compiler_options = config_lib.TPU_COMPILER_OPTIONS  # XLA:TPU
                                # --flag=value options (TPU meshes only)

  if variants & {"shakespeare_char", "shakespeare_char_cpu"}:
    c.update(dict(
        eval_interval=250, eval_iters=200, log_interval=10,
        always_save_checkpoint=False, dataset="shakespeare_char",
        gradient_accumulation_steps=1, batch_size=64, block_size=256,
        n_layer=6, n_head=6, n_embd=384, dropout=0.2, learning_rate=1e-3,
        max_iters=5000, lr_decay_iters=5000, min_lr=1e-4, beta2=0.99,
        warmup_iters=100, wandb_project="shakespeare-char",
        wandb_run_name="mini-gpt"))
    c.data.input = ("https://raw.githubusercontent.com/karpathy/char-rnn/"
                    "master/data/tinyshakespeare/input.txt")
  if "shakespeare_char_cpu" in variants:
    # README: --device=cpu --compile=False --eval_iters=20 --log_interval=1
    # --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
    # --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0
    c.update(dict(
        eval_iters=20, log_interval=1, block_size=64, batch_size=12,
        n_layer=4, n_head=4, n_embd=128, max_iters=2000, lr_decay_iters=2000,
        dropout=0.0, dtype="float32"))
  gpt2 = variants & set(_GPT2_SIZES)
  if gpt2:
    name = gpt2.pop()
    n_layer, n_head, n_embd = _GPT2_SIZES[name]
    c.update(dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                  block_size=1024, bias=True))
    c.model.vocab_size = 50257
  if "maxtext22b" in variants:
    # MaxText commit 047f0c7 (configs/8xv4-128.sh): scale=3 of base.yml's
    # 16 x 2048 decoder (head_dim 256), ici_fsdp_parallelism=64,
    # per_device_batch_size=16.
    _maxtext(c, n_layer=48, n_head=24, n_embd=6144, per_chip=16, chips=64)
    if "seq2048" in variants:
      # configs/v4/22b.sh (Dec 2023): 2048 tokens with flash attention; 16
      # sequences per chip fit neither MaxText (its script went to 15, then
      # 13) nor, by our memory sum, us (36.8 GiB; not rechecked since XLA's
      # compile became the verdict, session 92); 12 does (29.3 GiB).
      c.block_size = 2048
      c.model.attention = "splash"
      c.batch_size = 12 * 64
  if "maxtext52b" in variants:
    # MaxText commit 281e04bf3 (configs/1xv4-384.sh, 2xv4-384.sh): scale=4
    # of base.yml with base_num_decoder_layers=8, base_emb_dim=3072,
    # base_mlp_dim=12288: 32 layers of 12288, 32 heads of head_dim 256 (the
    # attention is 8192 wide), MLP 49152; ici_fsdp_parallelism=192,
    # per_device_batch_size=10.
    _maxtext(c, n_layer=32, n_head=32, n_embd=12288, per_chip=10, chips=192)
    c.model.head_size = 256
  v5e = variants & set(_MAXTEXT_V5E)
  if v5e:
    # MaxText commit 289fa330 (configs/largest_job/<size>.sh on v5e-256):
    # base.yml's 16 x 2560 decoder (8 heads of head_dim 256, mlp_dim 8192)
    # grown by global_parameter_scale, max_target_length=2048,
    # enable_flash_attention=true, remat_policy=full, FSDP over the slice
    # (the 128B: 16 x 16 FSDP x tensor), data parallel over slices.
    n_layer, n_head, n_embd, mlp, per_chip, model = _MAXTEXT_V5E[v5e.pop()]
    _maxtext(c, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
             per_chip=per_chip, chips=256)
    _maxtext_2048(c, mlp, model, _MAXTEXT_V5E_FLAGS)
    # head_gather: the whole float32 table otherwise stays live from the
    # token lookup to the loss (32B: 16.42 -> 15.04 GiB per chip).
    c.model.head_gather = "compute"
  v5p = variants & set(_MAXTEXT_V5P)
  if v5p:
    # The same decoder family on v5p: remat_policy=minimal up to 256B, FSDP
    # x tensor over the slice, data parallel over slices.
    (n_layer, n_head, n_embd, mlp, per_chip, model, remat_policy,
     chips) = _MAXTEXT_V5P[v5p.pop()]
    _maxtext(c, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
             per_chip=per_chip, chips=chips)
    _maxtext_2048(c, mlp, model, _MAXTEXT_V5P_FLAGS)
    c.model.remat_policy = remat_policy
  return c.lock()


def _maxtext_2048(c, mlp: int, model: int, flags: str) -> None:
  """What MaxText's v5e and v5p runs share beyond `_maxtext`: sequence 2048
  with flash (splash) attention, heads of 256, its mlp_dim, a tensor axis
  of `model` chips and its LIBTPU_INIT_ARGS."""
  c.block_size = 2048
  c.model.update(head_size=256, mlp_size=mlp, attention="splash")
  c.mesh.model = model
  # Their LIBTPU_INIT_ARGS, and ours that lets a multi-slice step keep its
  # collective matmuls (trm/core/tpu_flags.py; MaxText's programs did not
  # need it: BUILD_NOTES "Session 97").
  c.tpu_compiler_options = f"{flags} {tpu_flags.COLLECTIVE_MATMUL_USERS}"
  # base.yml's rules put activations' embed axis on 'tensor' (our model);
  # ours keep it whole, which only matters with tensor parallelism.
  c.logical_axis_rules = tuple(
      (name, "model" if name == "activation_embed" else axes)
      for name, axes in c.logical_axis_rules)


def _maxtext(c, n_layer: int, n_head: int, n_embd: int, per_chip: int,
             chips: int) -> None:
  """What MaxText's 2023 benchmark runs share (base.yml): sequence 1024
  (the v5e runs then set 2048), vocabulary 32768 with tied embeddings
  (logits_via_embedding), no bias or dropout, bfloat16, remat_policy=full
  over scanned layers, FSDP over the slice; our loss in chunks of 256
  positions and a bfloat16 residual."""
  c.update(dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                block_size=1024, bias=False, dropout=0.0,
                batch_size=per_chip * chips, gradient_accumulation_steps=1,
                dtype="bfloat16", loss_chunk_size=256))
  c.model.update(vocab_size=32768, remat=True, scan_layers=True,
                 residual_dtype="bfloat16")
  c.mesh.update(data=1, fsdp=-1, model=1)
