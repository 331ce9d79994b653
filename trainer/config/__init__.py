"""The configuration schemas: the orchestrator's only door into the trainer, so never import torch here.

- `run`      the run configuration (`RunConfig`, written as run.yaml, read by every rank)
- `closed_rules` MLPerf's closed-division BERT rules as data (`CLOSED_RULES`), applied by `RunConfig`
- `dataset`  dataset manifests (`DatasetManifest`, datasets/*.yaml)
- `paths`    `~` and `$VARS` in configured paths, expanded on the node that uses them
- `checkpoint_folder` which checkpoint of a run is the latest and whether its log is the one it saw (trainer and status)
- `base`     frozen sections, `ConfigProblem` (a broken rule with its key) and `first_problem`
- `exits`    the requeue exit code, importing nothing (the trainer's first lines need it)

May import: nothing of bertctl beyond this package
"""

import importlib

# Each name is imported from its module when first used (PEP 562), not when the package is: a control-plane
# command that reads one file (`bertctl status`: regular.py, paths.py) does not build the pydantic schemas
# (about a third of a second of every such process).
_HOME = {
    "base": ["ConfigProblem", "Section", "first_problem"],
    "dataset": ["DatasetManifest", "DatasetOutput", "load_dataset_manifest"],
    "paths": ["DEFAULT_BERTCTL_HOME", "PathError", "expand_path"],
    "exits": ["REQUEUE_EXIT_CODE"],
    "run": ["BIN_EDGES", "FINAL_WEIGHTS", "BalanceConfig", "CheckpointConfig", "DataConfig",
            "MLPerfConfig", "MetricsConfig", "ModelConfig", "OptimConfig", "RunConfig", "RuntimeConfig", "TrainConfig",
            "load_run_config", "mlperf_eval_interval"],
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
