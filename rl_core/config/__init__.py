"""All of a run's configuration: pydantic models per flow (data only), presets and launch options."""
