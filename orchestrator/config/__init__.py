"""Cluster files: `clusters` (the schema, `ClusterConfig`, and cluster-level checks), `configfile`
(YAML into a schema, `-o` overrides), `strictyaml` (YAML 1.2, safe by construction).

May import: orchestrator, trainer.config
"""
