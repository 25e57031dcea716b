"""A declarative post-training pipeline for reasoning models (design: docs/design.md)."""
