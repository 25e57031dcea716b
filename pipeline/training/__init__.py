"""Training runs: TRL's trainers with checkpoints, resume and trackers; the table drills."""
