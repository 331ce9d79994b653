"""Parallelism: `distributed` (process groups, collectives, device checks), `gradients` (DDP gradient
sync and clipping before or after the all-reduce, per bucket), `exchange` (exchange padding: a
group's samples sorted by length and dealt back out).

May import: trainer.config, trainer.data, trainer.model, trainer.balance, trainer.launch
"""
