"""Reinforcement learning on verifiable rewards: GRPO (guided replay, success amplification), TBRM, rewards."""
