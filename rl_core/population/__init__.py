"""Many runs as one population: population-based training's decisions (`pbt`), pure, with no flow in sight."""
