"""Data: the HDF5 layouts (layout.py), datasets, samplers and batch collation for the trainer, and
the preparation pipeline that produces the shards.

May import: trainer.config, trainer.balance, trainer.checkpoints
"""
