// One env step of every simulation of a persistent mjBatch in one pass on the batch's thread pool.
//
// mjb_apply hands each simulation's own mjData to a C function, loading its state row first and saving it
// after (save = 1), as mjb_step does. This function makes the same nstep calls to mj_step, then, for tasks
// that read contact forces, mj_rnePostConstraint (which mjb_step never runs), then copies the mjData fields
// the task reads into row `sim` of the caller's arrays, all on the thread that stepped the simulation.
// Built and loaded by native_step.py.
#include <stddef.h>
#include <string.h>

#include <mujoco/mjbatch.h>
#include <mujoco/mjxmacro.h>
#include <mujoco/mujoco.h>

typedef struct {
  size_t offset;       // offsetof(mjData, field): where the field's pointer is
  size_t bytes;        // bytes of the field in one simulation
  unsigned char* out;  // (nsim, bytes) destination
} GymflowCopy;

typedef struct {
  int nstep;                  // mj_step calls per env step (the task's frame skip)
  int post_constraint;        // nonzero: run mj_rnePostConstraint after the last one
  int ncopy;                  // number of copies
  const GymflowCopy* copies;  // fields to copy out after the step
} GymflowStep;

static void step_one(const mjModel* m, mjData* d, int sim, void* arg) {
  const GymflowStep* s = (const GymflowStep*)arg;
  for (int k = 0; k < s->nstep; ++k) mj_step(m, d);
  if (s->post_constraint) mj_rnePostConstraint(m, d);
  for (int c = 0; c < s->ncopy; ++c) {
    const GymflowCopy* copy = s->copies + c;
    const unsigned char* field = *(unsigned char* const*)((const char*)d + copy->offset);
    memcpy(copy->out + (size_t)sim * copy->bytes, field, copy->bytes);
  }
}

// offsetof(mjData, name) for an array field of mjData, or -1 if there is none of that name.
long gymflow_data_offset(const char* name) {
#define X(type, field, nr, nc) \
  if (!strcmp(name, #field)) return (long)offsetof(mjData, field);
  MJDATA_POINTERS
#undef X
  return -1;
}

// 1 if b is a persistent batch of nsim simulations whose state rows start at state: the check that an
// address found in the Python wrapper is the batch it wraps.
int gymflow_batch_matches(const mjBatch* b, int nsim, const mjtNum* state) {
  return mjb_nsim(b) == nsim && mjb_persistent(b) && mjb_state((mjBatch*)b) == state;
}

// Step all simulations of b as described by s, saving their state; return the number that failed.
int gymflow_step(mjBatch* b, const GymflowStep* s) {
  return mjb_apply(b, NULL, 0, step_one, (void*)s, 1);
}
