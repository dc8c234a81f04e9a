"""bench/pretraining_ablation.py's bookkeeping, on made-up results (the runs themselves take
an hour: a benchmark): which runs it would start, and the table's means, sample standard
deviations and differences in units of the pooled seed spread."""
import json
import math
import os
import statistics

from bench import pretraining_ablation as ablation


def write_result(args, task, start, seed, score):
    folder = ablation.finetune_folder(args, task, start, seed)
    os.makedirs(folder)
    with open(os.path.join(folder, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"test": {ablation.TASKS[task][1]: score}}, f)


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")


def parse(tmp_path):
    return ablation.argparse.Namespace(out=str(tmp_path), tasks=["trec"], seeds=[0, 1, 2],
                                       corpora=["brown", "sotu-wiki"], force=False,
                                       pretrain_steps=10, parallel=1)


def test_table_means_stds_and_differences(tmp_path):
    args = parse(tmp_path)
    scores = {"MLM + NSP, Brown": [0.80, 0.82, 0.84], "MLM only, Brown": [0.79, 0.80, 0.81],
              "random init": [0.70, 0.71, 0.75]}
    for start, values in scores.items():
        for seed, value in zip(args.seeds, values):
            write_result(args, "trec", start, seed, value)
    text, numbers = ablation.table(args)
    pretrained, scratch = numbers["trec"]["MLM + NSP, Brown"], numbers["trec"]["random init"]
    assert math.isclose(pretrained["mean"], 82.0) and math.isclose(scratch["mean"], 72.0)
    assert math.isclose(pretrained["std"], statistics.stdev([80, 82, 84]))      # sample std
    pooled = math.sqrt((statistics.stdev([80, 82, 84]) ** 2
                        + statistics.stdev([70, 71, 75]) ** 2) / 2)
    assert math.isclose(pretrained["difference"], 10.0)
    assert math.isclose(pretrained["in_stds"], 10.0 / pooled)
    assert "| TREC question type, 6 classes, 4,305 train | MLM + NSP, Brown | 82.0 +- 2.0 | 3 | " \
        "+10.0 (" in text
    assert "| MLM + NSP, sotu-wiki | not run | 0 |" in text      # a corpus not yet run
    write_result(args, "trec", "MLM + NSP, Brown", 3, 0.86)      # an earlier --seeds 3
    write_result(args, "trec", "MLM only, Brown", 10, 0.80)
    _, numbers = ablation.table(args)
    assert numbers["trec"]["MLM + NSP, Brown"]["seeds"] == 4
    assert math.isclose(numbers["trec"]["MLM + NSP, Brown"]["mean"], 83.0)
    assert numbers["trec"]["MLM only, Brown"]["seeds"] == 4


def test_only_missing_runs_are_started(tmp_path):
    """Per corpus: its two pretraining runs (MLM + NSP, --no-nsp), then every fine-tuning from
    its checkpoints whose results are missing; random init (Brown's config and vocab, no
    weights) belongs to Brown's turn and serves both corpora."""
    args = parse(tmp_path)
    jobs = ablation.pretraining_jobs(args, "brown")
    assert len(jobs) == 2 and "--no-nsp" in jobs[1][0] and "--no-nsp" not in jobs[0][0]
    sotu = ablation.pretraining_jobs(args, "sotu-wiki")
    assert all("sotu-wiki" in cmd and ablation.BROWN_VOCAB in cmd for cmd, _ in sotu)
    write_result(args, "trec", "random init", 1, 0.7)
    runs = ablation.finetune_jobs(args, "brown")
    assert len(runs) == 3 * 3 - 1
    scratch = [cmd for cmd, _ in runs if "--from-scratch" in cmd]
    brown_checkpoint = os.path.join(tmp_path, "pretrain-brown-mlm-nsp", "checkpoint")
    assert len(scratch) == 2 and all(brown_checkpoint in cmd for cmd in scratch)
    runs = ablation.finetune_jobs(args, "sotu-wiki")
    assert len(runs) == 2 * 3 and not any("--from-scratch" in cmd for cmd, _ in runs)
    assert all(os.path.join(tmp_path, "pretrain-sotu-wiki-") in cmd[cmd.index("--model") + 1]
               for cmd, _ in runs)
    # an interrupted pretraining run is resumed, a finished one is not started again
    touch(tmp_path / "pretrain-brown-mlm" / "checkpoint" / "trainer_state.json")
    touch(tmp_path / "pretrain-brown-mlm-nsp" / "eval.json")
    jobs = ablation.pretraining_jobs(args, "brown")
    assert len(jobs) == 1 and "--no-nsp" in jobs[0][0] and "--resume" in jobs[0][0]


def test_the_few_label_setting_overrides_the_recipe(tmp_path):
    """finetune.py takes the last of a repeated flag: the subset's 10 epochs must come after
    the recipe's 3."""
    args = parse(tmp_path)
    args.tasks = ["trec-1k"]
    cmd = ablation.finetune_jobs(args, "brown")[0][0]
    epochs = [cmd[i + 1] for i, flag in enumerate(cmd) if flag == "--epochs"]
    assert epochs[-1] == "10" and "--max-train-examples" in cmd
    assert finetune_epochs(cmd) == 10.0


def finetune_epochs(cmd):
    import finetune
    return finetune.parse_args(cmd[cmd.index("finetune.py") + 1:]).epochs
