"""bertctl's control plane: cluster files -> validated run configuration -> sbatch script -> Slurm.

Runs on a login node or a laptop and never imports torch (`bertctl --help` must be instant).
"""

__version__ = "0.1.0"
