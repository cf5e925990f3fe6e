"""DiffuCoder-7B / Dream-7B (Qwen2-shaped masked-diffusion LM) fine-tuning.

  --config=configs/diffucoder_7b.py        the real 7B (config.json of
                                           DiffuCoder-7B-Instruct)
  --config=configs/diffucoder_7b.py:tiny   a 64-wide, 2-layer model with the
                                           same code, for CPU tests

Parameters are float32 (7.616B, ~122 GB with AdamW state), sharded FSDP over
every device by default; compute is bfloat16.
"""
import ml_collections

from trm import config_lib


def get_config(arg=None):
  variants = config_lib.parse_variants(arg, {"tiny"})
  c = ml_collections.ConfigDict()

  c.model = ml_collections.ConfigDict(dict(
      name="dream",             # model family, see trm/models/__init__.py
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
      dtype="bfloat16",         # compute dtype of activations
      param_dtype="float32",    # stored parameters: float32 | bfloat16
      remat="full",             # none | full: recompute blocks in backward
      scan_layers=True,         # nn.scan the layers: compile time flat in depth
  ))

  c.data = ml_collections.ConfigDict(dict(
      name="jsonl",             # placeholder data source
      path="",                  # training data file
  ))

  c.optim = ml_collections.ConfigDict(dict(
      lr=1e-5,                  # AdamW peak learning rate (float)
      warmup_steps=100,         # linear warmup steps (int)
      beta1=0.9,                # AdamW beta1 (float)
      beta2=0.999,              # AdamW beta2 (float)
      eps=1e-8,                 # AdamW epsilon (float)
      weight_decay=0.0,         # decoupled weight decay (float)
      grad_clip_norm=1.0,       # global-norm gradient clipping (float)
  ))

  c.seed = 0                    # init and masking randomness
  c.global_batch_size = 64      # sequences per train step, over all devices
  c.seq_len = 2048              # tokens per sequence (Dream's trained context)
  c.total_steps = 10000         # train steps
  c.eval_every = 1000           # evaluation cadence in steps
  c.checkpoint_every = 1000     # save cadence in steps
  c.mesh = config_lib.mesh_config(data=1, fsdp=-1, model=1)
  c.logical_axis_rules = config_lib.default_logical_axis_rules()

  if "tiny" in variants:
    # Same code at toy sizes: 4 q heads over 2 kv heads (GQA groups of 2).
    c.model.update(vocab_size=512, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, mask_token_id=500, pad_token_id=1,
                   dtype="float32")
    c.global_batch_size = 8
    c.seq_len = 64
    c.total_steps = 100
    c.eval_every = 50
    c.checkpoint_every = 50
  return c.lock()
