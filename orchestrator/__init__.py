"""bertctl's control plane: cluster files -> validated run configuration -> sbatch script -> Slurm.

Runs on a login node or a laptop and never imports torch (`bertctl --help` must be instant). Its top
level keeps the verbs (`cli`), the user-error type (`errors`), where shipped files live (`resources`),
the experiment registry (`experiments`) and `bertctl export` (`export`); the libraries the verbs call live
in subpackages.

May import: orchestrator.config, orchestrator.rendering, orchestrator.jobs, orchestrator.checks,
orchestrator.results, orchestrator.data, trainer.config
"""

__version__ = "0.1.0"
