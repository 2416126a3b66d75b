"""Helpers the plans call: flow parameters, run start, progress, the run's report and store credentials."""
