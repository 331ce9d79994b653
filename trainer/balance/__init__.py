"""Load balancing: `algorithms` (numpy only: stratified quotas, sort and deal, packing), shared by the
trainer and `simulate` (the simulator behind `bertctl balance`, on the real Wikipedia length histogram).

May import: trainer.config, trainer.data
"""
