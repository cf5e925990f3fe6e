"""Dream / DiffuCoder masked diffusion: fine-tuning, exact and cached sampling."""
