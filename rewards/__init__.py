"""Rewards of your own for GRPO: `rewards.custom` in params.yaml names them as module:function.

This folder is a DVC dependency of the `grpo` stage: editing a module here re-runs GRPO.
"""
