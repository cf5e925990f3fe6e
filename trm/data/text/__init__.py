"""Text data: token windows (nanoGPT), SFT rows (DiffuCoder), tokenizers, TFDS."""
