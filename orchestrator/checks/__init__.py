"""What to know before spending an allocation: `preflight` (every node measured and judged), `predict`
(the time to train), `rehearsal` (the verdict on a launch-path probe), `balance` (the balance
simulator on a cluster's settings).

May import: orchestrator, orchestrator.config, orchestrator.jobs, orchestrator.results, trainer.config,
trainer.launch
"""
