"""trainer.balance."""
