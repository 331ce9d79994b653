"""Rendering: `render` (a validated cluster -> the exact script that runs it; a pure function).

May import: orchestrator, orchestrator.config, trainer.config
"""
