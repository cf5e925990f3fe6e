"""Layers shared by the model families (trm/families/*).

  attention.py      dot-product attention core (float32 softmax), GQA repeat
  dtypes.py         compute / parameter dtypes of a config (mixin)
  linear.py         logically named params, float32-accumulating matmul with
                    a hand-written backward, torch-style bias rounding
  masks.py          causal, key-padding and token-pair attention masks
  norm.py           RMSNorm (scale-free function and the scaled module)
  rope.py           rotary embeddings (rotate-half convention)
  tpu_attention.py  Pallas splash attention for TPU
"""
