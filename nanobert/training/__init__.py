"""The training harness that train.py and finetune.py share: plain functions and two small
classes, no callbacks. Each recipe keeps its own loop and calls these.

    run.py      start-up for one or many ranks, the optimizer, dropout seeds and state, batch order,
                eval mode, the run summary, the stop flag, and the one __main__ wrapper
    step.py     the update on the flat buffers: allreduce -> guard -> unscale -> clip -> AdamW
    guards.py   non-finite loss, gradients and weights: one wording, 1-based steps; a batch
                too large for the memory in one line
    metrics.py  metrics.jsonl (appending, cutting back on resume), the throughput window, MFU,
                the clock across resumed runs and the time left, the loss-curve plot
    resume.py   the trainer state, refusing a changed flag or model, restoring the model and
                optimizer, saving a checkpoint
    budget.py   the time budget: steps that fit, re-planned from the measured pace as the run goes
    pretraining.py  train.py's data (vocab, cached instances) and measures (MLM / NSP sums,
                held-out evaluation, unigram baseline, fill-mask example)
    tasks.py    finetune.py's tasks: readers, featurisers, heads, scores, prediction files,
                the collapsed-model report, and --do eval / predict on a fine-tuned folder
    finetuning.py  finetune.py's flags checked against each other, its defaults by model size,
                the output folder's name, best/ saved, the test set scored
    folder.py   --out: one run per folder (an OS lock held for the run's life), and a new run
                refused where it would lose what it did not make (a model, a checkpoint)
    grid.py     the paper's grid: every combination of --lr / --epochs / --batch-size run, the
                dev-best kept, the table; resumed without repeating a finished run
    compare.py  starts compared over seeds: finetune.py runs as jobs, a record per run, the
                rate chosen on dev, the difference in pooled seed stds (the ablation, the check)
    reference_runs.py  README's default runs, shipped: drawn behind a run's loss_curve.png,
                and the line placing a run against them
"""
