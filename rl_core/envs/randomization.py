"""Per-env randomization of body masses, friction and joint damping (domain randomization), off by default.

Each env g of a run draws its own factors from `default_rng([RANDOMIZATION_STREAM, seed, g])`, so an env's
dynamics depend only on (seed, global env index): a worker holding envs [k, k+n) and a restored or re-split
pool give env g the same model, which keeps checkpoints and state round trips exact.

The factors multiply the MJCF's values per element (each body, geom and dof gets its own factor). A body's
inertia is scaled with its mass (as a change of density would), so the body stays physically consistent.
All three factor vectors are always drawn, in a fixed order, so turning one quantity on or off never changes
the draws of the others.
"""
from __future__ import annotations

import mujoco
import mujoco.batch
import numpy as np

from rl_core.config.randomization import DynamicsRandomization

# Leads the seed key, so these draws never coincide with reset noise (keyed [seed, env, episode]).
RANDOMIZATION_STREAM = 0x52414E44  # "RAND"


def draw_factors(
    spec: DynamicsRandomization, model: mujoco.MjModel, seed: int, env_index: int
) -> dict[str, np.ndarray]:
    """The factors of global env `env_index`: 'mass' (nbody,), 'friction' (ngeom,), 'damping' (nv,)."""
    rng = np.random.default_rng([RANDOMIZATION_STREAM, seed, env_index])
    return {
        "mass": rng.uniform(*spec.mass, size=model.nbody),
        "friction": rng.uniform(*spec.friction, size=model.ngeom),
        "damping": rng.uniform(*spec.damping, size=model.nv),
    }


def randomize_batch(
    batch: mujoco.batch.Batch, model: mujoco.MjModel, spec: DynamicsRandomization, seed: int, env_offset: int
) -> np.ndarray:
    """Give each simulation of `batch` its own masses, friction and damping; returns the (nsim, nbody) masses.

    Only the quantities whose range is not (1, 1) are made per-simulation (`Batch.expand`); derived constants
    (subtree masses, inverse weights) follow through `Batch.set_const`. Call before the first reset.
    """
    factors = [draw_factors(spec, model, seed, env_offset + i) for i in range(batch.nsim)]
    stacked = {name: np.stack([f[name] for f in factors]) for name in ("mass", "friction", "damping")}
    if spec.mass != (1.0, 1.0):
        batch.expand("body_mass")[:] = model.body_mass * stacked["mass"]
        batch.expand("body_inertia")[:] = model.body_inertia * stacked["mass"][..., None]
        batch.set_const()  # body masses feed mj_setConst's derived constants; friction and damping do not
    if spec.friction != (1.0, 1.0):
        batch.expand("geom_friction")[:] = model.geom_friction * stacked["friction"][..., None]
    if spec.damping != (1.0, 1.0):
        batch.expand("dof_damping")[:] = model.dof_damping * stacked["damping"]
    masses = batch.expanded("body_mass")
    if masses is None:
        return np.broadcast_to(model.body_mass, (batch.nsim, model.nbody))
    return np.array(masses)
