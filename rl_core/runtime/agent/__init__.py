"""The agent flow's Ray actors and drivers: the generator, rollouts and simulation workers."""
