"""Probes and studies outside the DAG, each run from the repository root as `python -m experiments.<name>`.

experiments/README.md lists them; their results are in docs/experiments/.
"""
