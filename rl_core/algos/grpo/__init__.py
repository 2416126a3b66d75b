"""GRPO for agent runs: episodes with a generator, group-relative scoring, the token-level update, SFT warm start."""
