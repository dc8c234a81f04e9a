"""A time budget (--minutes): the step count that fits, from timed passes before training,
then re-planned once from the wall time the first real steps took."""
import math
import time


def steps_for_budget(model, batch, grad_accum, minutes):
    """Time forward+backward passes on `batch` (the fastest of three after a warm-up;
    parameters are untouched) and return how many optimizer steps fit in the budget, leaving
    ~10% for the optimizer, logging and evaluation."""
    model.loss_and_grads(batch)
    times = []
    for _ in range(3):
        start = time.time()
        model.loss_and_grads(batch)
        times.append(time.time() - start)
    per_step = min(times) * grad_accum * 1.1
    steps = max(1, int(60 * minutes / per_step))
    print(f"~{per_step:.2f} s per step: {steps} steps fit in {minutes:g} minutes")
    return steps


def budget_end(minutes):
    """When a budget of `minutes` that starts now ends (inf: no budget)."""
    return time.time() + 60 * minutes if minutes else math.inf


def replan_steps(minutes, step, end):
    """Fit the step count to the speed measured over the first `step` steps of a fresh run:
    the probe before training may have met a busy machine, and it times steps alone, while
    the budget also pays for held-out evaluations and checkpoints. Wall time per step counts
    them, so the schedule ends (lr at 0) within the budget. -> the new step count."""
    now = time.time()
    per_step = (now - (end - 60 * minutes)) / step          # the budget began the loop
    steps = max(step + 1, step + int((end - now) / per_step * 0.95))
    print(f"re-planned from the measured speed: {steps} steps in all")
    return steps
