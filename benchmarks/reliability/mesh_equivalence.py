"""Does a train step on a mesh of 8 CPU devices compute what it computes on
one device? (BUILD_NOTES, "Session 56: a fourth audit".)

  python benchmarks/reliability/mesh_equivalence.py --family=gpt --sgd \
      --meshes='8,1,1;1,8,1;1,1,8;2,2,2;4,2,1;2,1,4'
  python benchmarks/reliability/mesh_equivalence.py --family=trm --sgd \
      --steps=4 --meshes='8,1,1;2,2,2;4,1,1,2' model.halt_max_steps=2

Builds the family's config (`trm`: trm_sudoku.py:cpu, `trm_att`:
trm_sudoku.py:cpu,att, `gpt`: gpt.py:shakespeare_char_cpu shrunk to 2
layers of 32, batch 8 x 2 micro-batches, `dream`: diffucoder_7b.py:tiny),
applies the `key=value` overrides (Python literals), initialises the
state and compiles the step as `trm.main` does, then runs `--steps` steps
on the same synthetic batches on one device and on each mesh
(`data,fsdp,model[,dcn_data]`). `--sgd` swaps the family's optimizer for
plain SGD at rate 1, so a step's parameter change is minus its gradient.

Prints, per mesh: the largest relative difference of any metric, the
largest parameter difference over the one-device run's largest change of
that parameter (with --sgd: relative to the gradient's scale; one float32
ulp of a parameter near 1 shows as up to ~1e-4 there, hence the absolute
figure beside it), and for the rest of the state (EMA weights, TRM's
carry) the difference in ulps of its largest value. A mesh the trainer
refuses prints its one-line error.
"""
import argparse
import ast
import json
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
CONFIGS = {"trm": ("configs/trm_sudoku.py", "cpu"),
           "trm_att": ("configs/trm_sudoku.py", "cpu,att"),
           "gpt": ("configs/gpt.py", "shakespeare_char_cpu"),
           "dream": ("configs/diffucoder_7b.py", "tiny")}
GPT_VOCAB = 65


def make_config(family: str, overrides: dict):
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  path, arg = CONFIGS[family]
  config = config_lib.load_config(os.path.join(ROOT, path), arg)
  if family == "gpt":  # small enough for 2 cores
    config_lib.set_values(config, {
        "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16,
        "batch_size": 8, "gradient_accumulation_steps": 2,
        "model.vocab_size": GPT_VOCAB, "warmup_iters": 0})
  return config_lib.set_values(config, overrides)


def use_sgd() -> None:
  """Plain SGD at rate 1 in every family's step."""
  import optax  # pylint: disable=g-import-not-at-top
  from trm.families.dream import steps as dream_steps  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import steps as gpt_steps  # pylint: disable=g-import-not-at-top
  from trm.families.trm import steps as trm_steps  # pylint: disable=g-import-not-at-top
  gpt_steps.make_optimizer = lambda config: optax.sgd(1.0)
  trm_steps.make_optimizer = lambda optim, total: optax.sgd(1.0)
  dream_steps.make_optimizer = lambda optim, total: optax.sgd(1.0)


def make_batch(family: str, program, config, shapes, step: int,
               ignored_rows: int):
  """Deterministic synthetic training batch number `step`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1000 + step)
  rows = config.global_batch_size
  batch = {}
  for name, field in program.batch_spec.items():
    if field.eval_only:
      continue
    shape = (rows, *field.shape)
    if family.startswith("trm"):
      high = (shapes.num_puzzle_identifiers if name == "puzzle_identifiers"
              else shapes.vocab_size)
      value = rng.integers(0 if name == "puzzle_identifiers" else 1, high,
                           shape)
    elif family == "gpt":
      value = rng.integers(0, GPT_VOCAB, shape)
      if name == "y":
        value[:ignored_rows] = -1  # whole devices without a scored target
    elif name == "tokens":
      value = rng.integers(0, 100, shape)
    else:
      value = rng.random(shape) < 0.8
    batch[name] = value.astype(field.dtype)
  return batch


def float_leaves(state) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  return {jax.tree_util.keystr(path): np.asarray(jax.device_get(value))
          for path, value in jax.tree_util.tree_leaves_with_path(state)
          if hasattr(value, "dtype")
          and np.issubdtype(value.dtype, np.floating)
          and "opt_state" not in jax.tree_util.keystr(path)}


def run_steps(family: str, config, devices, steps: int, ignored_rows: int):
  """(metrics per step, float leaves before, float leaves after)."""
  import jax  # pylint: disable=g-import-not-at-top
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import run_checks  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  run_checks.check_config(config)
  families.check_config(config)
  ctx = mesh_lib.ShardingContext.from_config(config, devices)
  ctx.check_batch_size(config.global_batch_size)
  module = families.program(config.model.name)
  shapes = (module.data_shapes(config, {}) if family.startswith("trm")
            else None)
  program = module.build(config, ctx, shapes)
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  state = state_lib.init_state(program.init_fn, ctx, shardings)
  before = float_leaves(state)
  step_fn = task_lib.compile_train_step(program, ctx, config.global_batch_size,
                                        abstract, shardings)
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)
  metrics = []
  for i in range(steps):
    batch = make_batch(family, program, config, shapes, i, ignored_rows)
    batch = {k: jax.device_put(v, batch_shardings[k])
             for k, v in batch.items()}
    state, values = step_fn(state, batch)
    metrics.append({k: float(v.compute()) if hasattr(v, "compute")
                    else float(v) for k, v in values.items()})
  return metrics, before, float_leaves(state)


def compare(one, mesh) -> dict:
  """The differences `one` (one device) -> `mesh` described above."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  (metrics1, before1, after1), (metrics8, before8, after8) = one, mesh
  figures = {"metrics_rel": 0.0, "metrics_at": None, "params_rel": 0.0,
             "params_abs": 0.0, "params_at": None, "other_ulps": 0.0,
             "other_at": None}
  for name, a in after1.items():
    if not np.array_equal(before1[name], before8[name]):
      raise AssertionError(f"{name}: the initial states differ")
    b = after8[name].astype(np.float64)
    diff = float(np.abs(a.astype(np.float64) - b).max())
    if name.startswith((".params", ".puzzle_emb")):
      change = float(np.abs(a.astype(np.float64) - before1[name]).max())
      rel = diff / (change if change > 0 else max(np.abs(a).max(), 1e-30))
      if rel > figures["params_rel"]:
        figures.update(params_rel=rel, params_abs=diff, params_at=name)
    else:  # moved by far less than their size: counted in ulps instead
      ulps = diff / float(np.spacing(np.abs(a).max().astype(a.dtype)))
      if ulps > figures["other_ulps"]:
        figures.update(other_ulps=ulps, other_at=name)
  for step, (x, y) in enumerate(zip(metrics1, metrics8)):
    for key in x:
      rel = abs(x[key] - y[key]) / max(abs(x[key]), 1e-30)
      if rel > figures["metrics_rel"]:
        figures.update(metrics_rel=rel, metrics_at=f"step {step} {key}")
  return figures


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--family", choices=sorted(CONFIGS), required=True)
  parser.add_argument("--meshes", default="8,1,1;1,8,1;1,1,8;2,2,2;4,2,1;"
                      "2,1,4", help="data,fsdp,model[,dcn_data];...")
  parser.add_argument("--steps", type=int, default=2)
  parser.add_argument("--sgd", action="store_true")
  parser.add_argument("--ignored_rows", type=int, default=0,
                      help="gpt: rows whose targets are all ignored (-1)")
  parser.add_argument("overrides", nargs="*", help="config key=value")
  args = parser.parse_args()
  overrides = {}
  for item in args.overrides:
    key, _, text = item.partition("=")
    try:
      overrides[key] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      overrides[key] = text
  import jax  # pylint: disable=g-import-not-at-top
  if args.sgd:
    use_sgd()
  print(f"devices: {len(jax.devices())} x {jax.devices()[0].device_kind}; "
        f"jax {jax.__version__}; family {args.family}; steps {args.steps}; "
        f"sgd {args.sgd}; overrides {json.dumps(overrides)}")
  config = make_config(args.family, overrides)
  config.mesh.update(data=1, fsdp=1, model=1)
  one = run_steps(args.family, config, jax.devices()[:1], args.steps,
                  args.ignored_rows)
  for text in args.meshes.split(";"):
    data, fsdp, model, *slices = (int(x) for x in text.split(","))
    config = make_config(args.family, overrides)
    config.mesh.update(data=data, fsdp=fsdp, model=model)
    if slices:  # consecutive CPU devices stand for a slice
      config.mesh.update(dcn_data=slices[0])
    try:
      mesh = run_steps(args.family, config, jax.devices(), args.steps,
                       args.ignored_rows)
    except Exception as e:  # pylint: disable=broad-except
      print(f"mesh {text}: refused: {type(e).__name__}: "
            f"{str(e).splitlines()[0][:300]}")
      continue
    f = compare(one, mesh)
    print(f"mesh {text}: metrics max rel {f['metrics_rel']:.2g} "
          f"({f['metrics_at']}); params max diff / update "
          f"{f['params_rel']:.2g} (abs {f['params_abs']:.2g}, "
          f"{f['params_at']}); other state {f['other_ulps']:.3g} ulps "
          f"({f['other_at']})")
    sys.stdout.flush()


if __name__ == "__main__":
  main()
