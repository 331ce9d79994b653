"""Results and compliance: `resultlog` (reading a result log, bertctl's checks on its events), `summary`
(what a run's log says), `resultset` (a set of logs to judge), `compliance` (the official checker),
`rulesets` (a past round's rules as they stood), `identity` (what a run and a set claim to be),
`closed_log` (the closed division read from the log), `accepted` (what published, accepted results
show), `scoring` (olympic score, RCP), `verdict` (the verdict on a set), `package` (the submission
layout), `plot`.

May import: orchestrator, orchestrator.config, trainer.config
"""
