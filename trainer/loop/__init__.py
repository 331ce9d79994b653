"""The run: `entry` (`python -m trainer`'s torch-free front: arguments, the configuration checked, --once;
`run_args` the arguments' type and `fail`, `lifeline` what ties the process to its job),
`train` (the `Trainer` and its loop, read top to bottom), `state` (where the loop is and its
counting), `tally` (a step's sums on the device), `progress` (the progress line, metrics and MFU),
`warmup` (maximum-length passes before the first step), `precision` (autocast, fp16 loss scaling),
`evaluate` (masked-LM accuracy over the eval set), `stragglers` (which rank holds the others back).

May import: trainer, trainer.config, trainer.data, trainer.model, trainer.parallel, trainer.checkpoints
"""
