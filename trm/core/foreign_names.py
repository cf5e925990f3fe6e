"""Other trainers' names for our fields and flags (nanoGPT's, MaxText's,
Hugging Face Trainer's, big_vision's), and what a command copied from them
must say instead: `config_lib.parse_flags` adds the hint to its one-line
error for an unknown flag or config field."""

from __future__ import annotations


# nanoGPT's train.py / sample.py flags with no field or flag of that name
# here, and what a command copied from nanoGPT's README must say instead.
_NANOGPT_FLAGS = {
    "out_dir": "nanoGPT's out_dir is --workdir=DIR here",
    "device": ("JAX runs on the devices it finds, JAX_PLATFORMS=cpu keeps it "
               "on the CPU: drop nanoGPT's device"),
    "compile": "every step is compiled by XLA: drop nanoGPT's compile",
    "backend": ("JAX's distributed runtime picks the collectives: drop "
                "nanoGPT's backend"),
}


# MaxText's (base.yml), Hugging Face Trainer's (TrainingArguments) and
# big_vision's config names that our configs do not define, and the field
# that does the same here: what a command copied from those trainers must
# say instead.
_CADENCE = "the trainer's steps between {}: config.{} here"
_OTHER_TRAINERS = {
    **dict.fromkeys(("steps", "max_steps", "num_train_steps"),
                    "the run's length in steps is config.total_steps here"),
    # (upstream TRM's pretrain.py: epochs)
    **dict.fromkeys(("num_train_epochs", "total_epochs", "epochs"),
                    "the passes over the training data are config.num_epochs"
                    " here (it derives config.total_steps)"),
    **dict.fromkeys(("checkpoint_period", "save_steps", "ckpt_steps"),
                    _CADENCE.format("saves", "checkpoint_every")),
    **dict.fromkeys(("log_period", "logging_steps", "log_training_steps"),
                    _CADENCE.format("train metrics", "log_every")),
    "eval_interval": _CADENCE.format("evaluations", "eval_every"),
    "eval_steps": ("Hugging Face's eval_steps (a cadence) is "
                   "config.eval_every, MaxText's (batches per evaluation) "
                   "config.data.max_eval_batches (GPT: eval_iters)"),
    **dict.fromkeys(("save_total_limit", "max_num_checkpoints_to_keep"),
                    "config.keep_checkpoints keeps the newest N (and the "
                    "best) checkpoints"),
    "keep_ckpt_steps": "config.keep_checkpoint_every is big_vision's "
                       "keep_ckpt_steps",
    "metric_for_best_model": ("config.best_metric (e.g. 'eval/loss', "
                              "'eval/exact_accuracy') is Hugging Face's "
                              "metric_for_best_model"),
    "greater_is_better": ("config.best_metric_mode='max' (or 'min'; 'auto' "
                          "tells a loss from an accuracy) is Hugging Face's "
                          "greater_is_better"),
    **dict.fromkeys(("metrics_file", "log_history"),
                    "config.metrics_jsonl writes every metric to "
                    "WORKDIR/metrics.jsonl"),
    **dict.fromkeys(("per_device_batch_size", "per_device_train_batch_size"),
                    "the batch is set over the whole mesh: "
                    "config.global_batch_size (GPT: batch_size x "
                    "gradient_accumulation_steps)"),
    "dataset_type": ("config.data.source picks the data (configs/gpt.py "
                     "and configs/diffucoder_7b.py: 'synthetic' needs none)"),
    **dict.fromkeys(("enable_checkpointing", "save_strategy"),
                    "config.checkpoint_every sets the checkpoints' cadence "
                    "(the last step is saved); 0 writes none"),
    **dict.fromkeys(("enable_profiler", "profiler"),
                    "config.profiler_steps=N traces N steps (after "
                    "config.skip_first_n_steps_for_profiler)"),
    "max_target_length": ("the sequence length is config.block_size (GPT) "
                          "or config.seq_len (DiffuCoder)"),
    **dict.fromkeys(("warmup_steps", "warmup_steps_fraction"),
                    "warmup is in steps: config.optim.warmup_steps (GPT: "
                    "warmup_iters), or a share of the run: "
                    "config.optim.warmup_ratio (GPT: warmup_ratio)"),
    "warmup_ratio": ("config.optim.warmup_ratio (GPT: warmup_ratio), with "
                     "config.optim.warmup_steps=0"),
    **dict.fromkeys(("lr", "learning_rate"),
                    "the peak rate is config.optim.lr (GPT: learning_rate)"),
    **dict.fromkeys(("gradient_clipping_threshold", "max_grad_norm"),
                    "config.optim.grad_clip_norm (GPT: grad_clip; TRM does "
                    "not clip, as upstream)"),
    "gradient_accumulation_steps": ("only configs/gpt.py and configs/"
                                    "diffucoder_7b.py split a step into "
                                    "micro-batches"),
    **{f"{where}_{axis}_parallelism":
           f"the mesh axis is config.mesh.{prefix}{ours}"
       for where, prefix in (("ici", ""), ("dcn", "dcn_"))
       for axis, ours in (("data", "data"), ("fsdp", "fsdp"),
                          ("tensor", "model"))},
    "data_shuffle_seed": "config.data_seed is MaxText's data_shuffle_seed",
    "init_weights_seed": ("config.seed draws the initial weights (and the "
                          "model's noise); config.data_seed the data"),
    "z_loss_multiplier": "config.z_loss is MaxText's z_loss_multiplier "
                         "(configs/gpt.py)",
    # Fields of configs/gpt.py only, asked of the other families' configs.
    **dict.fromkeys(("label_smoothing", "z_loss"),
                    "only configs/gpt.py has label_smoothing and z_loss; "
                    "TRM's and DiffuCoder's losses are their upstreams'"),
    "label_smoothing_factor": ("config.label_smoothing is Hugging Face's "
                               "label_smoothing_factor (configs/gpt.py)"),
    "resume_from_checkpoint": ("rerun with the same --workdir: it resumes "
                               "from its newest checkpoint "
                               "(config.resume_step=N: from step N)"),
    **dict.fromkeys(("load_parameters_path", "model_name_or_path"),
                    "config.init_checkpoint names the weights to start "
                    "from"),
}
# Of those, the ones answered by a flag of trm.main (only where the tool
# takes --workdir).
_OTHER_WORKDIR = dict.fromkeys(
    ("output_dir", "base_output_directory", "run_name"),
    "the run's directory is --workdir=DIR here")


# Hugging Face generate()'s names for a flag a tool has under another name:
# {their name: (the tool's flag, what replaces it)}, said only by a tool
# that defines that flag.
_GENERATE_FLAGS = {
    "num_return_sequences": (
        "num_samples", "trm.evaluate's completions per problem are "
        "--num_samples=N (Hugging Face's num_return_sequences)"),
}


def generate_hint(name: str, flag_values) -> str | None:
  """What replaces Hugging Face generate()'s `name` (`_GENERATE_FLAGS`) in
  this tool (`flag_values`), or None."""
  ours, hint = _GENERATE_FLAGS.get(name, (None, None))
  return hint if ours is not None and ours in flag_values else None


def nanogpt_hint(name: str, flag_values) -> str | None:
  """What replaces nanoGPT's flag `name` (`_NANOGPT_FLAGS`), or None. The
  out_dir hint only where this tool takes --workdir (trm.main,
  trm.sample)."""
  if name == "out_dir" and "workdir" not in flag_values:
    return None
  return _NANOGPT_FLAGS.get(name)


def other_trainer_hint(name: str, flag_values) -> str | None:
  """What replaces MaxText's, Hugging Face's or big_vision's config name
  `name` (`_OTHER_TRAINERS`), or None."""
  if name in _OTHER_WORKDIR:
    return _OTHER_WORKDIR[name] if "workdir" in flag_values else None
  return _OTHER_TRAINERS.get(name)
