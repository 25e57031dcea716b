"""Data: the task, synthesis (Chain of Functions, image-to-video), a user's dataset, grading, mining, distillation."""
