"""A declarative post-training pipeline for reasoning models (see README.md)."""
