"""NVIDIA apex, optional (runtime.kernels: apex): usable only where its CUDA extensions were built.

apex's Python package imports without them (a plain `pip install` of its source builds none), and
then FusedLAMB refuses to start and FusedLayerNorm fails at its first forward. So "is apex there"
means: the package, and the compiled modules its fused optimizers and LayerNorm load.
"""

from __future__ import annotations

import importlib

MODULES = ("apex.optimizers", "apex.normalization", "amp_C", "fused_layer_norm_cuda")


def apex_missing() -> str | None:
    """None when apex and its CUDA extensions import; else the first module that does not."""
    for module in MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            return module
    return None
