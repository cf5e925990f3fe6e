"""GPT-2 trained and sampled as nanoGPT does."""
