"""bertctl's data plane: what every rank runs (BERT model, data, optimizers, distributed training,
evaluation, MLPerf logging, checkpoints, data preparation).

Importing the package imports nothing heavy: `trainer.config`, `trainer.mlperf`, `trainer.launch.probe`,
`trainer.launch.binding` and `trainer.launch.dist_env` stay torch-free for the launcher and the login node.

Its top level keeps the entry point (`__main__`), MLPerf logging (`mlperf`) and the optimizers (`optim`).

May import: trainer.config, trainer.model, trainer.loop, trainer.parallel
"""
