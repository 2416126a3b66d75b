"""Step outputs (experience, scored batches, staged learner state) and the run's path layout."""
from rl_core.data.run_layout import RunLayout
from rl_core.data.tensorfile import TensorFileError, read_tensors, write_tensors

__all__ = ["RunLayout", "TensorFileError", "read_tensors", "write_tensors"]
