"""The toy family's config: registers the family, then sets every knob."""
import ml_collections

from trm import families
from trm.core import config_lib

# The toy family lives in tests/; its folder must be importable (PYTHONPATH).
families.register("toy", "toy_family")


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  c.model = ml_collections.ConfigDict(dict(
      name="toy",      # the family, as registered above
      hidden=16,       # MLP width
  ))
  c.data = ml_collections.ConfigDict(dict(
      eval_batch_size=8,  # rows per evaluation batch
      prefetch=2,         # batches Grain prepares ahead
  ))
  c.optim = ml_collections.ConfigDict(dict(lr=1e-2))  # Adam learning rate
  c.seed = 0                    # init and data
  c.global_batch_size = 8       # rows per train step, over all devices
  c.total_steps = 3             # train steps
  c.eval_every = 3              # evaluation cadence in steps
  c.checkpoint_every = 3        # save cadence in steps
  c.log_every = 1               # train-metric cadence in steps
  c.keep_checkpoints = 1        # newest checkpoints kept on disk
  c.always_save_checkpoint = True  # False: save only when eval loss improves
  c.eval_only = False           # evaluate the restored model, then exit
  c.max_consecutive_bad_steps = 10  # NaN/Inf steps in a row to stop
  c.allow_config_change = False  # resume although the config changed
  c.resume_step = 0             # a saved step to resume from (0: newest)
  c.early_stopping_patience = 0  # evaluations without improvement to stop
  c.early_stopping_threshold = 0.0  # the eval loss improvement that counts
  c.best_metric = "eval/loss"  # the eval metric that ranks checkpoints
                                # (keep-N's best, --step=best) and early
                                # stopping (HF's metric_for_best_model)
  c.best_metric_mode = "auto"  # min | max | auto (min for a loss, max
                                # for an accuracy; HF's greater_is_better)
  c.mesh = config_lib.mesh_config()
  c.wandb = config_lib.wandb_config()
  c.logical_axis_rules = config_lib.default_logical_axis_rules()
  return c.lock()
