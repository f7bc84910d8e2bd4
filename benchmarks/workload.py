"""The standard checkpoint workloads, generated deterministically.

* ``mixed-1g``: 8 x 96 MiB, 200 x ~1 MiB, 2000 x 1-16 KiB float32 blobs (~0.96 GiB);
  ``mixed-4g``: the same mix scaled to ~4 GiB (more large blobs); ``mixed-256m``: a
  quarter of each group (~0.24 GiB); ``tiny``: a few MiB with the same shape of mix, for
  smoke runs.
* ``blobs-N``: N blobs of 4 KiB (float32), for the cost of each blob and file.
* ``gpt2-adam``: GPT-2 small (148 parameters, 124M float32 values) with Adam's state
  (per parameter: ``step``, ``exp_avg``, ``exp_avg_sq``, as ``torch.optim.Adam`` keeps
  them): 592 tensors, 1.39 GiB. ``gpt2-adam-narrow``: width 256 and 6 layers (its
  full vocabulary; 0.2 GiB), for small runs; ``gpt2-adam-tiny``: the same tensors at
  width 64.
"""

from __future__ import annotations

import numpy as np

MiB = 1 << 20
MIXES = ("mixed-1g", "mixed-4g", "mixed-256m", "tiny")
BLOB_COUNTS = (1_000, 10_000, 50_000)
WORKLOADS = (
    *MIXES,
    *(f"blobs-{count}" for count in (100, *BLOB_COUNTS)),
    "gpt2-adam",
    "gpt2-adam-tiny",
)


def make_workload(name: str) -> dict[str, np.ndarray]:
    """The blobs of workload ``name`` (same values every time)."""
    if name.startswith("blobs-"):
        return small_blobs(int(name.removeprefix("blobs-")))
    if name == "gpt2-adam":
        return gpt2_adam(width=768, vocab=50257, positions=1024, layers=12)
    if name == "gpt2-adam-narrow":
        return gpt2_adam(width=256, vocab=50257, positions=1024, layers=6)
    if name == "gpt2-adam-tiny":
        return gpt2_adam(width=64, vocab=1000, positions=128, layers=2)
    return mixed(name)


def mixed(name: str) -> dict[str, np.ndarray]:
    big, mid, small, big_size = {
        "mixed-1g": (8, 200, 2000, 96 * MiB),
        "mixed-4g": (40, 200, 2000, 96 * MiB),
        "mixed-256m": (2, 50, 500, 96 * MiB),  # the 1 GiB mix scaled by a quarter
        "tiny": (2, 20, 200, 1 * MiB),
    }[name]
    rng = np.random.default_rng(20261122)
    blobs: dict[str, np.ndarray] = {}
    for i in range(big):
        blobs[f"layers.{i}.weight"] = rng.random(big_size // 4, dtype=np.float32)
    for i in range(mid):
        size = (MiB if name != "tiny" else 64 << 10) // 4 + int(rng.integers(0, 1024))
        blobs[f"mid.{i}.weight"] = rng.random(size, dtype=np.float32)
    for i in range(small):
        blobs[f"small.{i}.bias"] = rng.random(int(rng.integers(256, 4096)), dtype=np.float32)
    return blobs


def small_blobs(count: int) -> dict[str, np.ndarray]:
    """``count`` float32 blobs of 4 KiB each."""
    values = np.random.default_rng(count).random((count, 1024), dtype=np.float32)
    return {f"blob.{i}": values[i].copy() for i in range(count)}


def gpt2_shapes(width: int, vocab: int, positions: int, layers: int) -> dict[str, tuple[int, ...]]:
    """GPT-2's parameters (Hugging Face names and Conv1D shapes)."""
    shapes: dict[str, tuple[int, ...]] = {
        "transformer.wte.weight": (vocab, width),
        "transformer.wpe.weight": (positions, width),
    }
    for layer in range(layers):
        prefix = f"transformer.h.{layer}."
        shapes |= {
            prefix + "ln_1.weight": (width,),
            prefix + "ln_1.bias": (width,),
            prefix + "attn.c_attn.weight": (width, 3 * width),
            prefix + "attn.c_attn.bias": (3 * width,),
            prefix + "attn.c_proj.weight": (width, width),
            prefix + "attn.c_proj.bias": (width,),
            prefix + "ln_2.weight": (width,),
            prefix + "ln_2.bias": (width,),
            prefix + "mlp.c_fc.weight": (width, 4 * width),
            prefix + "mlp.c_fc.bias": (4 * width,),
            prefix + "mlp.c_proj.weight": (4 * width, width),
            prefix + "mlp.c_proj.bias": (width,),
        }
    shapes |= {"transformer.ln_f.weight": (width,), "transformer.ln_f.bias": (width,)}
    return shapes


def gpt2_adam(width: int, vocab: int, positions: int, layers: int) -> dict[str, np.ndarray]:
    """GPT-2's parameters plus Adam's ``step``, ``exp_avg`` and ``exp_avg_sq`` for each."""
    rng = np.random.default_rng(124)
    blobs: dict[str, np.ndarray] = {}
    for name, shape in gpt2_shapes(width, vocab, positions, layers).items():
        blobs[f"model.{name}"] = rng.random(shape, dtype=np.float32)
        blobs[f"optim.{name}.step"] = np.array([1000.0], dtype=np.float32)
        blobs[f"optim.{name}.exp_avg"] = rng.random(shape, dtype=np.float32)
        blobs[f"optim.{name}.exp_avg_sq"] = rng.random(shape, dtype=np.float32)
    return blobs


def nbytes(blobs: dict[str, np.ndarray]) -> int:
    return sum(array.nbytes for array in blobs.values())
