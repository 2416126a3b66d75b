// mj_rnePostConstraint on every simulation of a persistent mjBatch, on the batch's own thread pool.
//
// mjb_apply hands each simulation's own mjData (the one its last step ran in) to a C function; this one
// runs mj_rnePostConstraint there and copies cacc, cfrc_int and cfrc_ext into row `sim` of the caller's
// (nsim, nbody, 6) arrays. Built and loaded by post_constraint.py.
#include <string.h>

#include <mujoco/mjbatch.h>
#include <mujoco/mujoco.h>

typedef struct {
  mjtNum* cacc;      // (nsim, nbody, 6), or NULL when not wanted
  mjtNum* cfrc_int;  // likewise
  mjtNum* cfrc_ext;  // likewise
} PostConstraintOut;

static void copy_row(mjtNum* out, const mjtNum* field, int sim, int nbody) {
  if (out) {
    size_t n = 6 * (size_t)nbody;
    memcpy(out + (size_t)sim * n, field, n * sizeof(mjtNum));
  }
}

static void post_constraint_one(const mjModel* m, mjData* d, int sim, void* arg) {
  const PostConstraintOut* out = (const PostConstraintOut*)arg;
  mj_rnePostConstraint(m, d);
  copy_row(out->cacc, d->cacc, sim, m->nbody);
  copy_row(out->cfrc_int, d->cfrc_int, sim, m->nbody);
  copy_row(out->cfrc_ext, d->cfrc_ext, sim, m->nbody);
}

// 1 if b is a persistent batch of nsim simulations whose state rows start at state: the check that an
// address found in the Python wrapper is the batch it wraps.
int gymflow_batch_matches(const mjBatch* b, int nsim, const mjtNum* state) {
  return mjb_nsim(b) == nsim && mjb_persistent(b) && mjb_state((mjBatch*)b) == state;
}

// Run on all simulations of b without saving their state; return the number of simulations that failed.
int gymflow_post_constraint(mjBatch* b, mjtNum* cacc, mjtNum* cfrc_int, mjtNum* cfrc_ext) {
  PostConstraintOut out = {cacc, cfrc_int, cfrc_ext};
  return mjb_apply(b, NULL, 0, post_constraint_one, &out, 0);
}
