"""Cluster files: `clusters` (the schema, `ClusterConfig`, and cluster-level checks), `configfile`
(YAML into a schema, `-o` overrides), `strictyaml` (YAML 1.2, safe by construction), `local_gpus` (this
machine's GPUs, for `gpus_per_node: auto`).

May import: orchestrator, trainer.config
"""
