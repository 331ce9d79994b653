"""orchestrator.checks."""
