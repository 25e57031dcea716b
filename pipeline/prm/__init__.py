"""The process reward model: labels, training rows, loss, scoring; contrast paths and rollout step labels."""
