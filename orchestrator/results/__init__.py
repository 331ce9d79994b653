"""Results and compliance: `resultlog` (reading a result log, bertctl's own checks), `summary` (what a
run's log says), `resultset` (a set of logs to judge), `compliance` (the official checker), `scoring`
(olympic score, RCP), `verdict` (the verdict on a set), `package` (the submission layout), `plot`.

May import: orchestrator, orchestrator.config, trainer.config
"""
