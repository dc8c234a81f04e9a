"""A time budget (--minutes): the step count that fits, from timed passes before training
(train.py), then re-planned from the measured pace as the run goes, so that the schedule (the
learning rate's decay to 0) ends at the last step that fits, also when the machine's pace
changes during the run."""
import math
import time

# Re-plan after every this fraction of the budget: a pace that changes is followed within it
REPLAN_EVERY = 0.05
# The share of the time left that a plan fills: room for the noise of the pace
FILL = 0.97


def now():
    """The budget's clock (a test puts a fake one here)."""
    return time.time()


def steps_for_budget(model, batch, grad_accum, minutes):
    """Time forward+backward passes on `batch` (the fastest of three after a warm-up;
    parameters are untouched) and return how many optimizer steps fit in the budget, leaving
    ~10% for the optimizer, logging and evaluation."""
    model.loss_and_grads(batch)
    times = []
    for _ in range(3):
        start = now()
        model.loss_and_grads(batch)
        times.append(now() - start)
    per_step = min(times) * grad_accum * 1.1
    steps = max(1, int(60 * minutes / per_step))
    print(f"~{per_step:.2f} s per step: {steps} steps fit in {minutes:g} minutes")
    return steps


class Budget:
    """--minutes from now on, for a schedule of `steps` steps that starts at `step`.

    over(): the budget is spent (the loop stops, a checkpoint, --resume goes on).
    plan(step): after each step, the step count: every REPLAN_EVERY of the budget it is fitted
    to the time left at the measured pace (the slower of the pace since the last plan and the
    pace since the start: a pace that halves is seen at once, and held-out evaluations and
    checkpoints are paid for), at most `cap` (finetune.py: its --epochs). With replan=False
    (--steps given, a resumed run) the step count stays and the budget only stops the run.
    No budget (minutes None): never over, the step count stays."""

    def __init__(self, minutes, steps, step=0, replan=True, cap=None):
        self.seconds = 60 * minutes if minutes else math.inf
        self.start = now()
        self.end = self.start + self.seconds
        self.steps, self.first_step, self.cap = steps, step, cap or math.inf
        self.replan = replan and minutes is not None
        self.mark = (self.start, step)            # (time, step) of the last plan

    def over(self):
        return now() > self.end

    def plan(self, step):
        t, (t_mark, step_mark) = now(), self.mark
        if not self.replan or step == step_mark or t - t_mark < REPLAN_EVERY * self.seconds:
            return self.steps
        per_step = max((t - t_mark) / (step - step_mark),
                       (t - self.start) / (step - self.first_step))
        fit = step + int((self.end - t) * FILL / per_step)
        steps = max(step, min(fit, self.cap))
        if abs(steps - self.steps) > 0.01 * self.steps:      # a change, not the pace's noise
            print(f"re-planned from the measured pace ({per_step:.3g} s per step): "
                  f"{steps} steps in all")
        self.steps, self.mark = steps, (t, step)
        return steps
