"""DiffuCoder-7B / Dream-7B (Qwen2-shaped masked-diffusion LM) fine-tuning.

  --config=configs/diffucoder_7b.py        the real 7B (config.json of
                                           DiffuCoder-7B-Instruct)
  --config=configs/diffucoder_7b.py:1b     Qwen2.5-1.5B-shaped (1.8B with the
                                           untied head), for one-GPU benchmarks
  --config=configs/diffucoder_7b.py:tiny   a 64-wide, 2-layer model with the
                                           same code and a byte tokenizer, for
                                           CPU tests and demos

Parameters are float32 (7.616B, ~122 GB with AdamW state), sharded FSDP over
every device by default; compute is bfloat16.
"""
import ml_collections

from trm.core import config_lib


def get_config(arg=None):
  variants = config_lib.parse_variants(arg, {"tiny", "1b"})
  if {"tiny", "1b"} <= variants:
    # Both size the same fields: ':tiny,1b' would silently be ':tiny'.
    raise ValueError("Choose one of the variants 'tiny' and '1b'.")
  c = ml_collections.ConfigDict()

  c.model = ml_collections.ConfigDict(dict(
      name="dream",             # model family, see trm/families/__init__.py
      vocab_size=152064,        # logits width (above the tokenizer's 151,668)
      hidden_size=3584,         # width D
      intermediate_size=18944,  # SwiGLU inner width
      num_hidden_layers=28,     # decoder blocks
      num_attention_heads=28,   # query heads (head_dim = D / heads = 128)
      num_key_value_heads=4,    # GQA kv heads (7 query heads each)
      rope_theta=1e6,           # RoPE base
      rms_norm_eps=1e-6,        # RMSNorm epsilon
      mask_token_id=151666,     # <|mask|>
      pad_token_id=151643,      # <|endoftext|> = eos = pad
      dtype="bfloat16",         # compute dtype: bfloat16 | float32 | float16
                                # (float16: with dynamic loss scaling)
      param_dtype="float32",    # stored parameters: float32 | bfloat16
      remat="full",             # none | full | minimal | custom: what a
                                # block keeps for backward (trm/nn/remat.py)
      remat_save="",            # custom: comma-separated names kept in HBM
                                # (decoder_layer_input, query_proj,
                                # key_proj, value_proj, out_proj, mlpwi,
                                # mlpwo, weight_matmul)
      remat_offload="",         # custom: names moved to host memory and
                                # back (pinned_host; TPU frees their HBM)
      scan_layers=True,         # nn.scan the layers: compile time flat in depth
      attention="dot",          # dot | splash (Pallas TPU kernel, seq % 128 == 0)
  ))

  c.data = ml_collections.ConfigDict(dict(
      source="files",           # files: data.path | tfds: data.tfds splits
                                # | synthetic: hashed ids, no data (step
                                # speed and memory without a data set)
      format="jsonl",           # jsonl: prompt/response pairs (or dllm's
                                # "messages" lists) | code: files
      path="",                  # JSONL file, or a glob of code files
      eval_path="",             # held-out data, same format; '' = hold out
      eval_rows=64,             # rows of `path` held out when eval_path is ''
                                # (synthetic: the held-out stream's rows)
      tokenizer="",             # dir with tokenizer.json, or 'bytes';
                                # '' = init_checkpoint's directory
      prompt_key="prompt",      # JSONL field of the prompt
      response_key="response",  # JSONL field of the response
      chat=True,                # wrap JSONL prompts in the ChatML template
      eval_batch_size=64,       # sequences per eval batch, over all devices
      max_eval_batches=-1,      # cap on eval batches (-1: all held-out rows)
      prefetch=2,               # batches Grain prepares ahead
      tfds=ml_collections.ConfigDict(dict(  # data.source='tfds' (README)
          name="trm_code_files",  # TFDS dataset[/config][:version]
          data_dir="",          # its `tfds build --data_dir`; '' = TFDS's
                                # default (~/tensorflow_datasets)
          split="train",        # training records
          eval_split="",        # held-out split; '' = hold out eval_rows
          feature="text",       # code: the document text feature (jsonl
                                # reads prompt_key / response_key instead)
      )),
  ))
  c.init_checkpoint = ""        # Hugging Face checkpoint dir to fine-tune
                                # from; '' = random initialisation

  c.optim = ml_collections.ConfigDict(dict(
      optimizer="adamw",        # or adam_atan2 | adafactor | lion | sgd
                                # (momentum beta1): same schedule, clipping
                                # and decoupled weight decay
      lr=1e-5,                  # peak learning rate (float)
      warmup_steps=100,         # linear warmup steps (int)
      warmup_ratio=0.0,         # > 0: warm up over ceil(ratio x total_steps)
                                # steps instead (HF's; warmup_steps=0)
      beta1=0.9,                # AdamW beta1 (float)
      beta2=0.999,              # AdamW beta2 (float)
      eps=1e-8,                 # AdamW epsilon (float)
      weight_decay=0.0,         # decoupled weight decay (float)
      grad_clip_norm=1.0,       # global-norm gradient clipping (float)
      lr_mults=(),              # ((regex, mult), ..): first full match of a
                                # '/'-joined param name scales its update
                                # (0 freezes it)
      wd_mults=(),              # same pairs, scaling its weight decay
  ))

  c.seed = 0                    # init, masking and data-order randomness
  c.data_seed = -1              # the data's own seed (training rows' order);
                                # -1: seed (HF's data_seed)
  c.global_batch_size = 64      # sequences per train step, over all devices
  c.gradient_accumulation_steps = 1  # micro-batches per step: global_batch_size
                                # / this rows in memory at once, gradients
                                # summed (the step is the whole batch's)
  c.seq_len = 2048              # tokens per sequence (Dream's trained context)
  c.total_steps = 10000         # train steps
  c.eval_every = 1000           # evaluation cadence in steps
  c.checkpoint_every = 1000     # save cadence in steps
  c.log_every = 10              # train-metric cadence in steps
  c.metrics_jsonl = True        # also WORKDIR/metrics.jsonl: one JSON object
                                # per write (step, metrics; NaN/Inf null)
  c.profiler_steps = 0          # train steps traced by jax.profiler into
                                # <workdir>/plugins/profile (0: none)
  c.skip_first_n_steps_for_profiler = 1  # steps of each run (and resume)
                                # before the trace: compile, warm-up
  c.keep_checkpoints = 3        # newest checkpoints kept on disk
  c.keep_checkpoint_every = 0   # also keep, for good, every step that is a
                                # multiple of N (0: none; big_vision's
                                # keep_ckpt_steps)
  c.always_save_checkpoint = True  # False: save only when eval loss improves
  c.eval_only = False           # evaluate the restored model, then exit
  c.compiled_step = ""         # file of trm.aot --save_compiled ('': compile)
  c.max_consecutive_bad_steps = 10  # NaN/Inf steps in a row to stop (0: never)
  c.num_epochs = 0.0            # > 0: total_steps derived from the data, this
                                # many passes over the training rows
                                # (HF's num_train_epochs; 0: total_steps as set)
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
  c.loss_chunk_size = 512       # positions whose logits exist at once
  c.loss_reduce_once = False    # sum lm_head's gradient over the batch
                                # devices once, not per chunk (+ vocab x
                                # hidden x 4 bytes a device)
  c.reduce_gradients_once = True  # micro-batches' gradients cross `data`
                                # once per step
  c.mesh = config_lib.mesh_config(data=1, fsdp=-1, model=1)
  c.loss_scale = config_lib.loss_scale_config()  # float16 compute only
  c.wandb = config_lib.wandb_config(project="diffucoder")  # W&B logging
  c.logical_axis_rules = config_lib.default_logical_axis_rules()
  c.tpu_compiler_options = config_lib.TPU_COMPILER_OPTIONS  # XLA:TPU
                                # --flag=value options (TPU meshes only)

  if "1b" in variants:
    # Qwen2.5-1.5B's transformer shapes with DiffuCoder's vocabulary.
    c.model.update(hidden_size=1536, intermediate_size=8960,
                   num_attention_heads=12, num_key_value_heads=2)
  if "tiny" in variants:
    # Same code at toy sizes: 4 q heads over 2 kv heads (GQA groups of 2).
    # Byte tokenizer: ids 0-255 are bytes, 256 <|endoftext|> (eos = pad),
    # 257 <|dlm_pad|>, 258 <|im_end|>; <|mask|> is model.mask_token_id.
    c.model.update(vocab_size=512, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, mask_token_id=500, pad_token_id=256,
                   dtype="float32")
    c.data.update(format="code", path="trm/**/*.py", tokenizer="bytes",
                  eval_rows=32, eval_batch_size=16)
    c.optim.update(lr=1e-3, warmup_steps=20)
    c.global_batch_size = 16
    c.seq_len = 128
    c.total_steps = 300
    c.eval_every = 100
    c.checkpoint_every = 100
    c.log_every = 20
  return c.lock()
