"""Operator tooling around the plans: the command line, the local UI stack, start-up and the orphan guard."""
