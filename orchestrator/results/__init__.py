"""orchestrator.results."""
