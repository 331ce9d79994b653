"""orchestrator.jobs."""
