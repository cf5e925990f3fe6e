r"""What `trm.evaluate --resume` reads to fingerprint a 7B checkpoint.

  PYTHONPATH=. python benchmarks/speed/fingerprint_cost.py DIR

Writes into DIR a Dream-7B-shaped Hugging Face directory (Qwen2.5-7B's
sizes, bfloat16, four safetensors shards written as sparse files, so it
takes no disk beyond the headers; an index and a config), then runs
`inference.source_fingerprint` on it once with its reads counted. Prints
the tensors, the bytes the shards claim, the bytes and number of reads,
and the seconds (page cache warm: the headers were just written).
"""
import json
import math
import os
import struct
import sys
import time

from trm.families.dream import inference

HIDDEN, INTERMEDIATE, LAYERS, VOCAB, KV_WIDTH = 3584, 18944, 28, 152064, 512
SHARDS = 4


def tensors() -> list[tuple[str, tuple[int, ...]]]:
  named = [("model.embed_tokens.weight", (VOCAB, HIDDEN)),
           ("lm_head.weight", (VOCAB, HIDDEN)),
           ("model.norm.weight", (HIDDEN,))]
  for layer in range(LAYERS):
    p = f"model.layers.{layer}."
    named += [
        (p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
        (p + "self_attn.q_proj.bias", (HIDDEN,)),
        (p + "self_attn.k_proj.weight", (KV_WIDTH, HIDDEN)),
        (p + "self_attn.k_proj.bias", (KV_WIDTH,)),
        (p + "self_attn.v_proj.weight", (KV_WIDTH, HIDDEN)),
        (p + "self_attn.v_proj.bias", (KV_WIDTH,)),
        (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
        (p + "mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN)),
        (p + "mlp.up_proj.weight", (INTERMEDIATE, HIDDEN)),
        (p + "mlp.down_proj.weight", (HIDDEN, INTERMEDIATE)),
        (p + "input_layernorm.weight", (HIDDEN,)),
        (p + "post_attention_layernorm.weight", (HIDDEN,))]
  return named


def write_checkpoint(directory: str) -> tuple[int, int]:
  """(tensors, bytes the shards claim) of the sparse checkpoint written."""
  os.makedirs(directory, exist_ok=True)
  named, total, index = tensors(), 0, {}
  for n in range(SHARDS):
    name = f"model-{n + 1:05d}-of-{SHARDS:05d}.safetensors"
    header, offset = {}, 0
    for tensor, shape in named[n::SHARDS]:
      size = 2 * math.prod(shape)
      header[tensor] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
      offset += size
      index[tensor] = name
    blob = json.dumps(header).encode()
    with open(os.path.join(directory, name), "wb") as f:
      f.write(struct.pack("<Q", len(blob)) + blob)
      f.truncate(8 + len(blob) + offset)
    total += 8 + len(blob) + offset
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": index}, f)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({"hidden_size": HIDDEN}, f)
  return len(named), total


def main(directory: str) -> None:
  count, total = write_checkpoint(directory)
  reads = []
  read_at = inference._read_at  # pylint: disable=protected-access
  inference._read_at = lambda f, offset, size: (  # pylint: disable=protected-access
      reads.append(size) or read_at(f, offset, size))
  start = time.perf_counter()
  inference.source_fingerprint(directory)
  seconds = time.perf_counter() - start
  print(f"{count} tensors, {total / 1e9:.2f} GB in {SHARDS} shards: the "
        f"fingerprint read {sum(reads) / 2**20:.2f} MiB in {len(reads)} "
        f"reads, {seconds:.3f} s (warm page cache, sparse files)")


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit(f"usage: {sys.argv[0]} DIR (a new or scratch directory)")
  main(sys.argv[1])
