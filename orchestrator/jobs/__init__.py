"""Jobs: `submit` (render, record, submit through submitit), `executors` (submitit's executor plugins
and job handles), `scheduler` (job states from one batched sacct/squeue call), `status`, `logs`,
`follow` (`submit --follow`), `lifecycle` (cancel, resume, rerun, diff).

May import: orchestrator, orchestrator.config, orchestrator.rendering, orchestrator.results,
orchestrator.checks, trainer.config
"""
