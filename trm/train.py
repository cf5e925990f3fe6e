"""The training loop, top to bottom: setup, mesh, data, model, shard, step,
checkpoint, loop. `python -m trm.main` calls `train_and_evaluate`.
"""
from __future__ import annotations

import json
import os
import time

import flax.linen as nn
import jax
import ml_collections
from absl import logging
from etils import epath
from clu import metric_writers, parameter_overview, periodic_actions

from trm import checkpoint as ckpt_lib
from trm import losses
from trm import mesh as mesh_lib
from trm import state as state_lib
from trm import tasks
from trm.data import pipeline


def check_config(config) -> None:
  """Rejects values that would only fail (or misbehave) deep in the run."""
  for key in ("total_steps", "eval_every", "checkpoint_every", "log_every",
              "keep_checkpoints", "data.prefetch"):
    node = config
    for name in key.split("."):
      node = node[name]
    if node <= 0:
      raise ValueError(f"config.{key}={node} must be a positive integer.")


def evaluate(eval_fn, state, eval_source, batch_shardings, hook=None,
             save_dir: str | None = None) -> dict:
  """Mean metrics over every batch of the held-out split, plus the task's
  hook's (e.g. ARC pass@K), which may write files into `save_dir`."""
  totals = None
  for k in range(len(eval_source)):
    batch = pipeline.to_global(eval_source[k], batch_shardings)
    metrics, outputs = eval_fn(state, batch)
    totals = losses.merge(totals, metrics)
    if hook is not None:
      hook.update(batch, outputs)
  results = losses.compute(totals) if totals else {}
  if hook is not None:
    results.update(hook.result(save_dir))
  return results


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str):
  """Trains, evaluates and checkpoints; resumes from `workdir` if it can."""
  # ---------------------------------------------------------------- setup
  check_config(config)
  is_main = jax.process_index() == 0
  workpath = epath.Path(workdir)  # local or gs://
  workpath.mkdir(parents=True, exist_ok=True)
  # Metrics are global: process 0 writes them, the others stay quiet.
  writer = (metric_writers.create_default_writer(workdir, asynchronous=True)
            if is_main else metric_writers.MultiWriter([]))
  if is_main:
    (workpath / "config.json").write_text(config.to_json_best_effort(indent=2))

  # ----------------------------------------------------------------- mesh
  mesh = mesh_lib.make_mesh(config.mesh)
  rules = mesh_lib.logical_rules(config)
  mesh_lib.check_batch_size(config.global_batch_size, mesh, rules)
  mesh_lib.check_batch_size(config.data.eval_batch_size, mesh, rules,
                            "data.eval_batch_size")
  logging.info("Mesh %s over %d devices, %d processes", dict(mesh.shape),
               mesh.size, jax.process_count())

  # ------------------------------------------------------ data and model
  # The model family's task reads its data and names its model and steps.
  task = tasks.build(config, workdir, mesh, rules)
  train_iter = pipeline.grain_iterator(task.train_source, config.data.prefetch)

  # ---------------------------------------------------------------- shard
  abstract, state_shardings = state_lib.abstract_state(task.init_fn, mesh,
                                                       rules)
  manager = ckpt_lib.make_manager(str(workpath / "checkpoints"),
                                  max_to_keep=config.keep_checkpoints)
  state = ckpt_lib.restore_latest(manager, abstract, train_iter)
  if state is None and task.initial_state is not None:
    state = task.initial_state(mesh, rules, state_shardings)
    logging.info("Initialised from %s.", config.get("init_checkpoint"))
  elif state is None:
    state = state_lib.init_state(task.init_fn, mesh, rules, state_shardings)
    logging.info("Initialised a new model.")
  start_step = int(state.step)
  if is_main:
    parameter_overview.log_parameter_overview(
        state.params, include_stats=jax.process_count() == 1)
  writer.write_hparams({"num_params": int(sum(
      x.size for x in jax.tree.leaves(state.params)))})

  # ----------------------------------------------------------------- step
  batch_shardings = task.batch_shardings
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    eval_step = jax.jit(task.eval_step,
                        in_shardings=(state_shardings, batch_shardings))
    compile_start = time.time()
    train_step = state_lib.compile_step(task.train_step, abstract,
                                        state_shardings, task.abstract_batch)
  compile_seconds = time.time() - compile_start
  memory = train_step.memory_analysis()
  logging.info(
      "Train step compiled in %.1f s; per device: arguments %.1f MiB, "
      "temporaries %.1f MiB", compile_seconds,
      getattr(memory, "argument_size_in_bytes", 0) / 2**20,
      getattr(memory, "temp_size_in_bytes", 0) / 2**20)
  writer.write_scalars(start_step, {"timing/compile_seconds": compile_seconds})

  def run_eval(step: int) -> dict:
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      start = time.time()
      hook = task.make_eval_hook() if task.make_eval_hook else None
      save_dir = None if "://" in workdir else os.path.join(workdir,
                                                            f"eval_{step}")
      results = evaluate(eval_step, state, task.eval_source, batch_shardings,
                         hook, save_dir)
    results = {f"eval/{k}": v for k, v in results.items()}
    results["eval/seconds"] = time.time() - start
    writer.write_scalars(step, results)
    if is_main:
      (workpath / f"eval_{step}.json").write_text(json.dumps(results, indent=1))
    return results

  def write_train_metrics(step: int, metrics) -> None:
    writer.write_scalars(step, {f"train/{k}": v for k, v in
                                losses.compute(metrics).items()})

  # ----------------------------------------------------------------- loop
  report = periodic_actions.ReportProgress(
      num_train_steps=config.total_steps, writer=writer, every_secs=30)
  hooks = [report] if is_main else []
  train_metrics, pending, results = None, None, {}
  step = start_step
  logging.info("Training from step %d to %d.", start_step, config.total_steps)
  try:
    with metric_writers.ensure_flushes(writer):
      while step < config.total_steps:
        batch = pipeline.to_global(next(train_iter), batch_shardings)
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
          state, metrics = train_step(state, batch)
        step += 1
        train_metrics = losses.merge(train_metrics, metrics)
        for hook in hooks:
          hook(step)
        # Metrics are fetched one interval late so the host never waits on
        # the step it just dispatched.
        if step % config.log_every == 0 or step == config.total_steps:
          if pending is not None:
            write_train_metrics(*pending)
          pending, train_metrics = (step, train_metrics), None
        if step % config.eval_every == 0 or step == config.total_steps:
          with report.timed("eval"):
            results = run_eval(step)
          logging.info("Step %d eval: %s", step, results)
        if step % config.checkpoint_every == 0 or step == config.total_steps:
          ckpt_lib.save(manager, step, state, train_iter)
      if pending is not None:
        write_train_metrics(*pending)
      if start_step >= config.total_steps:  # a finished run: report again
        results = run_eval(step)
  finally:
    # Also on a crash: a save in flight completes, so the newest checkpoint
    # on disk is whole.
    manager.wait_until_finished()
  logging.info("Final evaluation at step %d: %s", step, "  ".join(
      f"{k.removeprefix('eval/')}={v:.4f}" for k, v in sorted(results.items())))
  return state, results
