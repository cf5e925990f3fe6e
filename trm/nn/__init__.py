"""Layers shared by the model families (trm/families/*).

  attention.py      dot-product attention core (float32 softmax), GQA repeat
  dtypes.py         compute / parameter dtypes of a config (mixin)
  linear.py         logically named params, float32-accumulating matmul with
                    a hand-written backward, torch-style bias rounding
  losses.py         softmax cross-entropy with a one-pass backward
  masks.py          causal, key-padding and token-pair attention masks
  norm.py           RMSNorm (scale-free function and the scaled module)
  platform.py       the platform a traced program runs on (mesh or backend)
  rope.py           rotary embeddings (rotate-half convention)
  temperature.py    logits over a sampling temperature without overflow
  tpu_attention.py  Pallas splash attention for TPU
"""
