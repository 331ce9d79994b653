"""trainer.model."""
