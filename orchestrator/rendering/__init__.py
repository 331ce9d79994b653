"""orchestrator.rendering."""
