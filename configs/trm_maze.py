"""TRM on Maze-Hard (30x30).

  --config=configs/trm_maze.py          paper setup, attention (85.3%)
  --config=configs/trm_maze.py:bs128    upstream's 1-GPU command (batch 128)
  --config=configs/trm_maze.py:noaug    upstream's data exactly: its builder
                                        defaults to no augmentation
  --config=configs/trm_maze.py:cpu      small model on a small generated set;
                                        a smoke run on a 2-core CPU (it does
                                        not learn much in its 100 steps)

The paper setup is upstream's README command
  torchrun --nproc-per-node 4 pretrain.py arch=trm
  data_paths=[data/maze-30x30-hard-1k] evaluators=[] epochs=50000
  eval_interval=5000 lr=1e-4 puzzle_emb_lr=1e-4 weight_decay=1.0
  puzzle_emb_weight_decay=1.0 arch.L_layers=2 arch.H_cycles=3
  arch.L_cycles=4 ema=True  (global batch 768)
Upstream trained it on 4 L40S in under 24 h; a later README adds a 1-GPU
variant with global_batch_size=128 (also under 24 h, "no noticeable loss").
Paper: 85.3% exact accuracy (whole path right) on the 1,000 test mazes with
TRM-Att (7M parameters); TRM-MLP scores 0.0% on Maze, hence attention here.

Data: our builder (trm/data/puzzles/maze.py) adds the 8 dihedral images of each
training maze by default, as the paper describes; upstream's builder
defaults to no augmentation, so its README command trains without it. Use
`:noaug` for upstream's data. The step counts do not change: upstream counts
an epoch as one pass over the 1,000 groups, whatever their size.

TPU: XLA refuses this step on one v4-8 (61.95G of temporaries per chip
for its 30.75 GiB); add --config.model.remat=True there (19.10 GiB).
From v4-16 up it fits as it is (30.46 GiB per chip on v4-16, 28.49 on
v4-32; `python -m trm.aot --config=configs/trm_maze.py --topology=v4-16`).
"""
import ml_collections

from trm.core import config_lib

# Upstream measures time in epochs over the 1,000 training groups.
_GROUPS, _BATCH = 1000, 768
_EPOCHS, _EVAL_EPOCHS = 50000, 5000


def get_config(arg=None):
  variants = config_lib.parse_variants(arg, {"cpu", "bs128", "noaug"})
  if {"cpu", "bs128"} <= variants:
    raise ValueError("Choose one of the variants 'cpu' and 'bs128'.")
  batch = 128 if "bs128" in variants else _BATCH
  c = ml_collections.ConfigDict()

  c.model = ml_collections.ConfigDict(dict(
      name="trm",               # model family, see trm/families/__init__.py
      hidden_size=512,          # width D
      num_heads=8,              # attention heads (head_dim = D / heads)
      expansion=4.0,            # SwiGLU expansion
      L_layers=2,               # depth of the one shared network
      H_cycles=3,               # T: outer recursions per ACT step
      L_cycles=4,               # n: z_L updates per outer recursion
      halt_max_steps=16,        # N_sup: ACT supervision steps
      halt_exploration_prob=0.1,  # chance a row must run a random min steps
      puzzle_emb_ndim=512,      # puzzle-embedding width (0 = none)
      puzzle_emb_len=16,        # prefix positions in front of the tokens
      pos_encodings="rope",     # rope | learned | none
      mlp_t=False,              # token-mixing MLP instead of attention
      mlp_kernel="dot",         # SwiGLUs: dot | pallas (TPU) | triton (GPU,
                                # mlp_t token mixer) | *_interpret (CPU)
      attention="dot",          # dot | splash (TPU) | splash_interpret | cudnn
      rms_norm_eps=1e-5,        # scale-free RMSNorm epsilon
      rope_theta=10000.0,       # RoPE base
      forward_dtype="bfloat16",  # activations; parameters stay float32
      no_ACT_continue=True,     # halt on sigmoid(q_halt) alone (TRM)
      remat=False,              # recompute blocks in backward (less memory):
                                # one v4-8 needs it (trm.aot; docstring)
  ))

  c.data = ml_collections.ConfigDict(dict(
      name="maze",              # dataset builder in trm/data/
      data_dir="data/maze-30x30-hard-1k-aug8",  # '' = <workdir>/data
      epochs_per_iter=_EVAL_EPOCHS,  # epochs per shuffle block (eval_interval)
      eval_batch_size=batch,    # global batch of the evaluation
      max_eval_batches=-1,      # evaluate on at most this many (-1: all)
      eval_sheet_rows=8,        # rows drawn to eval_<step>/sheet.png (0: none)
      prefetch=2,               # batches Grain prepares ahead
      # How to build the data when data_dir holds none:
      build=ml_collections.ConfigDict(dict(
          source="hub",         # hub (download) | csv (from csv_dir) | generate
          csv_dir="",           # directory with train.csv / test.csv
          subsample_size=-1,    # training mazes kept (-1: all 1,000)
          aug=True,             # 8 dihedral images per training maze
          num_train=1000,       # generate: training mazes
          num_test=1000,        # generate: test mazes
          min_path_length=111,  # generate: shortest path > 110 moves
          seed=0,               # builder seed (generation, subsample)
      )),
  ))

  c.optim = ml_collections.ConfigDict(dict(
      optimizer="adam_atan2",   # upstream's; or adamw | adafactor | lion |
                                # sgd (momentum beta1), same schedule and
                                # decoupled weight decay
      lr=1e-4,                  # peak learning rate
      lr_min_ratio=1.0,         # cosine floor; 1.0 = constant after warmup
      warmup_steps=2000,        # linear warmup from lr/warmup_steps
      warmup_ratio=0.0,         # > 0: warm up over ceil(ratio x total_steps)
                                # steps instead (HF's; warmup_steps=0)
      beta1=0.9,                # AdamATan2 (AdamW, Lion) betas
      beta2=0.95,
      weight_decay=1.0,         # decoupled, on every parameter
      puzzle_emb_lr=1e-4,       # sparse sign-SGD on the puzzle embeddings
      puzzle_emb_weight_decay=1.0,
      ema=True,                 # evaluate and keep an EMA of the parameters
      ema_rate=0.999,           # EMA decay
      freeze_weights=False,     # train the puzzle embeddings alone (test-
                                # time adaptation; upstream's freeze_weights)
      lr_mults=(),              # ((regex, mult), ..): first full match of a
                                # '/'-joined param name scales its update
                                # (0 freezes; not the puzzle embeddings)
      wd_mults=(),              # same pairs, scaling its weight decay
  ))

  c.seed = 0                    # model init, ACT exploration, data order
  c.data_seed = -1              # the data's own seed (batch order, examples
                                # drawn); -1: seed (HF's data_seed)
  c.global_batch_size = batch   # rows per train step, over all devices
  # Upstream runs epochs / eval_interval iterations of the full batches
  # that eval_interval epochs fill (each drops its last partial batch), so
  # 50k epochs are 65,100 steps at batch 768 (its formula's 65,104 is never
  # reached) and 390,620 at batch 128; an evaluation ends each iteration.
  c.eval_every = _EVAL_EPOCHS * _GROUPS // batch  # 5k epochs
  c.total_steps = _EPOCHS // _EVAL_EPOCHS * c.eval_every
  c.checkpoint_every = c.eval_every          # save cadence in steps
  c.keep_checkpoints = 3        # newest checkpoints kept on disk
  c.keep_checkpoint_every = 0   # also keep, for good, every step that is a
                                # multiple of N (0: none; big_vision's
                                # keep_ckpt_steps)
  c.always_save_checkpoint = True  # False: save only when eval loss improves
  c.eval_only = False           # evaluate the restored model, then exit
  c.init_checkpoint = ""        # a new run's weights: a trm.main workdir
                                # (its newest step; DIR/checkpoints/N: step
                                # N; DIR/checkpoints/best: its best) or an
                                # upstream PyTorch checkpoint file
  c.compiled_step = ""         # file of trm.aot --save_compiled ('': compile)
  c.max_consecutive_bad_steps = 10  # NaN/Inf steps in a row to stop (0: never)
  c.num_epochs = 0.0            # > 0: total_steps derived from the data, this
                                # many passes over the training examples
                                # (HF's num_train_epochs; 0: total_steps as set)
  c.resume_step = 0             # resume from this saved step; the newer
                                # ones move to checkpoints_abandoned/ (0:
                                # the newest; HF's resume_from_checkpoint)
  c.early_stopping_patience = 0  # stop after N evaluations in a row with
                                # no eval loss improvement (0: never; HF's)
  c.early_stopping_threshold = 0.0  # the improvement that counts (HF's)
  c.best_metric = "eval/loss"  # the eval metric that ranks checkpoints
                                # (keep-N's best, --step=best) and early
                                # stopping (HF's metric_for_best_model);
                                # the paper's: 'eval/exact_accuracy'
  c.best_metric_mode = "auto"  # min | max | auto (min for a loss, max
                                # for an accuracy; HF's greater_is_better)
  c.allow_config_change = False  # resume although model/optim/data/seed/batch
                                # differ from the run's config.json
  c.log_every = 100             # train metrics cadence in steps
  c.metrics_jsonl = True        # also WORKDIR/metrics.jsonl: one JSON object
                                # per write (step, metrics; NaN/Inf null)
  c.profiler_steps = 0          # train steps traced by jax.profiler into
                                # <workdir>/plugins/profile (0: none)
  c.skip_first_n_steps_for_profiler = 1  # steps of each run (and resume)
                                # before the trace: compile, warm-up
  c.mesh = config_lib.mesh_config()
  c.wandb = config_lib.wandb_config(project="trm-maze")  # W&B logging
  c.logical_axis_rules = config_lib.default_logical_axis_rules()
  c.reduce_gradients_once = True  # gradients cross `data` once per step
                                # (False: GSPMD's, per use and micro-step)
  c.tpu_compiler_options = config_lib.TPU_COMPILER_OPTIONS  # XLA:TPU
                                # --flag=value options (TPU meshes only)

  if "noaug" in variants:
    c.data.data_dir = "data/maze-30x30-hard-1k"
    c.data.build.aug = False

  if "cpu" in variants:
    # A smoke run for 2 CPU cores: 1,000 generated mazes (8,000 training
    # puzzles with augmentation), a 64-wide attention model, fewer
    # recursions and ACT steps, float32 (bfloat16 is slow on CPUs). Attention
    # over 916 positions makes a step far dearer than Sudoku's (XLA:CPU
    # materialises the [batch, heads, 916, 916] scores; time grows faster
    # than the batch), hence batch 8 and 100 steps: expect little learning.
    c.model.update(hidden_size=64, num_heads=2, H_cycles=2, L_cycles=2,
                   halt_max_steps=4, puzzle_emb_ndim=64,
                   forward_dtype="float32")
    c.data.update(data_dir="", epochs_per_iter=1, eval_batch_size=16,
                  max_eval_batches=-1)
    c.data.build.update(source="generate", subsample_size=-1,
                        num_train=1000, num_test=64)
    c.optim.update(lr=1e-3, puzzle_emb_lr=1e-2, warmup_steps=20,
                   weight_decay=0.1, puzzle_emb_weight_decay=0.1,
                   ema_rate=0.95)
    c.global_batch_size = 8
    c.total_steps = 100
    c.eval_every = 50
    c.checkpoint_every = 50
    c.log_every = 10
  return c.lock()
