"""The configuration schemas: the orchestrator's only door into the trainer, so never import torch here.

- `run`      the run configuration (`RunConfig`, written as run.yaml, read by every rank)
- `closed_rules` MLPerf's closed-division BERT rules as data (`CLOSED_RULES`), applied by `RunConfig`
- `dataset`  dataset manifests (`DatasetManifest`, datasets/*.yaml)
- `paths`    `~` and `$VARS` in configured paths, expanded on the node that uses them
- `base`     frozen sections, `ConfigProblem` (a broken rule with its key) and `first_problem`

May import: nothing of bertctl beyond this package
"""

from trainer.config.base import ConfigProblem, Section, first_problem
from trainer.config.dataset import DatasetManifest, DatasetOutput, load_dataset_manifest
from trainer.config.paths import DEFAULT_BERTCTL_HOME, PathError, expand_path
from trainer.config.run import (
    BIN_EDGES,
    REQUEUE_EXIT_CODE,
    BalanceConfig,
    CheckpointConfig,
    DataConfig,
    MLPerfConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    RuntimeConfig,
    TrainConfig,
    load_run_config,
    mlperf_eval_interval,
)

__all__ = [
    "BIN_EDGES", "REQUEUE_EXIT_CODE", "BalanceConfig", "CheckpointConfig", "ConfigProblem", "DataConfig",
    "DatasetManifest", "DatasetOutput", "DEFAULT_BERTCTL_HOME", "MLPerfConfig", "ModelConfig", "OptimConfig",
    "PathError", "RunConfig", "RuntimeConfig", "Section", "TrainConfig", "expand_path", "first_problem",
    "load_dataset_manifest", "load_run_config", "mlperf_eval_interval",
]
