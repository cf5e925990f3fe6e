r"""Per-chip memory and fit verdicts on TPU topologies, as a Markdown table.

  python benchmarks/forecast/aot_table.py [--rows=sudoku,arc] > table.md
  python benchmarks/forecast/aot_table.py --rows=diffucoder:5,diffucoder_sample

`--rows` names groups, or one row of a group as GROUP:INDEX (from 0).

Compiles each row's real train step (TRM, or DiffuCoder's masked-diffusion
fine-tuning step) with `trm.aot` (libtpu compile-only
devices, no TPU needed; `pip install -e .[tpu]`). Rows: model config x
topology x mesh x batch. Dataset shapes come from `trm.aot.dataset_metadata`
(ARC-AGI-1 with ConceptARC and 1000 augmentations: 900 tokens, vocabulary
12, 876,406 puzzle identifiers), so nothing is built. The `diffucoder_sample`
rows compile DiffuCoder's whole sampling loop instead (`trm.aot
--mode=sample`) and print a table of their own.
"""
import os
import sys

from trm import aot  # sets the libtpu environment before jax loads
from trm.core import config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

SUDOKU, ARC, DIFFUCODER = "trm_sudoku.py", "trm_arc.py", "diffucoder_7b.py"
# DiffuCoder README / Dream eval settings: alg entropy, temperature 0.3,
# top_p 0.95 (compiles the vocabulary sort), one token per step; prompts
# left-padded to 512, 512 new tokens (Dream's HumanEval setting; 1024 of the
# 2048 trained context).
SAMPLE = dict(prompt_len=512, max_new_tokens=512, steps=512, alg="entropy",
              temperature=0.3, top_p=0.95)
BF16 = {"param_dtype": "bfloat16"}
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
        ("TRM ARC-1 (configs/trm_arc.py:arc1)", "arc1", {}, {}, "v4-8", 1, {},
         {"config_file": ARC}),
        ("TRM ARC-1, no remat", "arc1", {"remat": False}, {}, "v4-8", 1, {},
         {"config_file": ARC}),
        ("TRM ARC-1 (configs/trm_arc.py:arc1)", "arc1", {}, {}, "v4-64", 1, {},
         {"config_file": ARC}),
        ("TRM ARC-1, table on fsdp", "arc1", {}, {}, "v4-64", 1,
         {"data": 1, "fsdp": -1}, {"config_file": ARC}),
        ("TRM ARC-2 (configs/trm_arc.py:arc2)", "arc2", {}, {}, "v4-8", 1, {},
         {"config_file": ARC}),
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
        ("DiffuCoder 7B, seq 2048", "", {}, {}, "v4-64", 1, {},
         {"config_file": DIFFUCODER, "global_batch_size": 384}),
    ],
    # Sampling: "global batch" is prompts per call (extra["sample_batch"]).
    "diffucoder_sample": [
        ("DiffuCoder 7B sampling", "", {}, {}, "v4-8", 1, {},
         {"config_file": DIFFUCODER, "sample_batch": 16}),
        ("DiffuCoder 7B sampling", "", {}, {}, "v4-8", 1, {},
         {"config_file": DIFFUCODER, "sample_batch": 32}),
        ("DiffuCoder 7B sampling", "", BF16, {}, "v4-8", 1, {},
         {"config_file": DIFFUCODER, "sample_batch": 32}),
        ("DiffuCoder 7B sampling", "", {}, {}, "v4-64", 1, {},
         {"config_file": DIFFUCODER, "sample_batch": 256}),
        ("DiffuCoder 7B sampling", "", BF16, {}, "v4-64", 1, {},
         {"config_file": DIFFUCODER, "sample_batch": 256}),
    ],
}
HEADERS = {
    "train": (
        "| model | topology | mesh (data, fsdp, model) | global batch | "
        "per-device batch | args GiB | temp GiB | sum GiB; XLA's peak / chip | "
        "verdict | compile s | step s at 50% MFU |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"),
    "sample": (
        "| model | topology | mesh (data, fsdp, model) | params | prompts "
        "(per device) | prompt + new tokens, steps | args GiB | temp GiB | "
        "sum GiB; XLA's peak / chip | verdict | compile s | call s at 50% "
        "MFU | new "
        "tokens/s at 50% MFU |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"),
}


def load_config(variant, config_file=SUDOKU):
  return config_lib.load_config(os.path.join(ROOT, "configs", config_file),
                                variant)


def main(argv):
  names = argv[1].removeprefix("--rows=").split(",") if len(argv) > 1 else \
      list(ROWS)
  selected = []
  for name in names:
    group, _, index = name.partition(":")
    if group not in ROWS or (index and not (
        index.isdigit() and int(index) < len(ROWS[group]))):
      known = ", ".join(f"{g} (rows 0-{len(r) - 1})" for g, r in ROWS.items())
      raise SystemExit(f"--rows: no row group {name!r}; known: {known}.")
    selected += [ROWS[group][int(index)]] if index else ROWS[group]
  kind = None
  for row in selected:
    label, variant, model, shapes, topo, slices, mesh, extra = row
    extra = dict(extra)
    config = load_config(variant, extra.pop("config_file", SUDOKU))
    sample_batch = extra.pop("sample_batch", None)
    config.model.update(model)
    config.mesh.update(mesh)
    config.update(extra)
    metadata = aot.data_shapes(config, shapes)
    sample = (None if sample_batch is None else
              aot.SampleSettings(batch=sample_batch, **SAMPLE))
    if kind != ("sample" if sample else "train"):
      kind = "sample" if sample else "train"
      print(("\n" if row is not selected[0] else "") + HEADERS[kind])
    report = aot.compile_report(config, aot.parse_topology(topo), slices,
                                metadata, sample)
    m = report["mesh"]
    where = f"{slices} x {topo}" if slices > 1 else topo
    memory = (f"{report['argument_gib']:.2f} | {report['temp_gib']:.2f} | "
              f"{report['total_gib']:.2f}; {report['peak_gib']:.2f} / "
              f"{report['usable_gib']}"
              if "total_gib" in report else
              f"- | - | compiler: out of HBM / {report['usable_gib']}")
    verdict = "FITS" if report["fits"] else "DOES NOT FIT"
    if sample:
      print(f"| {label} | {where} | {m['data']}, {m['fsdp']}, {m['model']} "
            f"| {report['param_dtype']} | {report['sample_batch']} "
            f"({report['per_device_batch']:g}) | {report['prompt_len']} + "
            f"{report['max_new_tokens']}, {report['steps']} | {memory} | "
            f"{verdict} | {report['compile_seconds']:.0f} | "
            f"{report['call_seconds_at_50pct_mfu']:.1f} | "
            f"{report['new_tokens_per_second_at_50pct_mfu']:.0f} |",
            flush=True)
    else:
      print(f"| {label} | {where} | {m['data']}, {m['fsdp']}, {m['model']} "
            f"| {report['global_batch_size']} | "
            f"{report['per_device_batch']:g} | {memory} | {verdict} | "
            f"{report['compile_seconds']:.0f} | "
            f"{report['step_seconds_at_50pct_mfu']:.3f} |", flush=True)


if __name__ == "__main__":
  main(sys.argv)
