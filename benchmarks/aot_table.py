r"""Per-chip memory and fit verdicts on TPU topologies, as a Markdown table.

  python benchmarks/aot_table.py [--rows=sudoku,arc] > table.md

Compiles each row's real train step (TRM, or DiffuCoder's masked-diffusion
fine-tuning step) with `trm.aot` (libtpu compile-only
devices, no TPU needed; `pip install -e .[tpu]`). Rows: model config x
topology x mesh x batch. ARC rows use the Sudoku config file with ARC's data
shapes (30x30 grids = 900 tokens, 12 tokens, 876,406 puzzle identifiers for
ARC-AGI-1 with 1000 augmentations) and upstream's ARC architecture
(attention, L_cycles 4) until the ARC config exists.
"""
import os
import sys

from trm import aot  # sets the libtpu environment before jax loads
from trm import config_lib
from trm.data import sudoku

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARC_SHAPES = dict(seq_len=900, vocab_size=12, num_puzzle_identifiers=876406)
ARC_MODEL = dict(mlp_t=False, pos_encodings="rope", L_cycles=4)

SUDOKU, DIFFUCODER = "trm_sudoku.py", "diffucoder_7b.py"
# (label, variant, model overrides, shapes, topology, slices, mesh, extra);
# rows use configs/trm_sudoku.py unless extra names another "config_file".
ROWS = {
    "sudoku": [
        ("TRM Sudoku MLP-t", "", {}, {}, "v4-8", 1, {}, {}),
        ("TRM Sudoku MLP-t", "", {}, {}, "v4-64", 1, {}, {}),
        ("TRM Sudoku MLP-t", "", {}, {}, "v4-64", 2, {"dcn_data": 2}, {}),
        ("TRM Sudoku attention", "att", {}, {}, "v4-8", 1, {}, {}),
    ],
    "arc": [
        ("TRM ARC-1 (attention)", "", ARC_MODEL, ARC_SHAPES, "v4-8", 1, {}, {}),
        ("TRM ARC-1 (attention), remat", "", dict(ARC_MODEL, remat=True),
         ARC_SHAPES, "v4-8", 1, {}, {}),
        ("TRM ARC-1 (attention)", "", ARC_MODEL, ARC_SHAPES, "v4-64", 1, {},
         {}),
        ("TRM ARC-1 (attention), table on fsdp", "", ARC_MODEL, ARC_SHAPES,
         "v4-64", 1, {"data": 1, "fsdp": -1}, {}),
    ],
    "diffucoder": [
        ("DiffuCoder 7B, seq 2048", "", {}, {}, "v4-64", 1, {},
         {"config_file": DIFFUCODER, "global_batch_size": 128}),
        ("DiffuCoder 7B, seq 2048", "", {}, {}, "v4-64", 1, {},
         {"config_file": DIFFUCODER, "global_batch_size": 256}),
        ("DiffuCoder 7B, seq 2048", "", {}, {}, "v4-64", 1, {},
         {"config_file": DIFFUCODER, "global_batch_size": 512}),
        ("DiffuCoder 7B, seq 2048", "", {}, {}, "v4-64", 2,
         {"dcn_data": 2}, {"config_file": DIFFUCODER,
                           "global_batch_size": 256}),
        ("DiffuCoder 7B, seq 2048", "", {}, {}, "v4-16", 1, {},
         {"config_file": DIFFUCODER, "global_batch_size": 8}),
    ],
}


def load_config(variant, config_file=SUDOKU):
  return config_lib.load_config(os.path.join(ROOT, "configs", config_file),
                                variant)


def main(argv):
  groups = argv[1].removeprefix("--rows=").split(",") if len(argv) > 1 else \
      list(ROWS)
  print("| model | topology | mesh (data, fsdp, model) | global batch | "
        "per-device batch | args GiB | temp GiB | total GiB / usable | "
        "verdict | compile s | step s at 50% MFU |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for group in groups:
    for label, variant, model, shapes, topo, slices, mesh, extra in ROWS[group]:
      extra = dict(extra)
      config = load_config(variant, extra.pop("config_file", SUDOKU))
      config.model.update(model)
      config.mesh.update(mesh)
      config.update(extra)
      metadata = sudoku.dataset_metadata(1)
      metadata = metadata.__class__(**{**metadata.__dict__, **shapes})
      report = aot.compile_report(config, aot.parse_topology(topo), slices,
                                  metadata)
      m = report["mesh"]
      where = f"{slices} x {topo}" if slices > 1 else topo
      memory = (f"{report['argument_gib']:.2f} | {report['temp_gib']:.2f} | "
                f"{report['total_gib']:.2f} / {report['usable_gib']}"
                if "total_gib" in report else
                f"- | - | compiler: out of HBM / {report['usable_gib']}")
      print(f"| {label} | {where} | {m['data']}, {m['fsdp']}, {m['model']} | "
            f"{report['global_batch_size']} | {report['per_device_batch']:g} |"
            f" {memory} | {'FITS' if report['fits'] else 'DOES NOT FIT'} | "
            f"{report['compile_seconds']:.0f} | "
            f"{report['step_seconds_at_50pct_mfu']:.3f} |", flush=True)


if __name__ == "__main__":
  main(sys.argv)
