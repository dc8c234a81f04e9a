"""bench/pretraining_ablation.py's protocol and bookkeeping, on made-up runs (the real ones take
hours: a benchmark): the rate is chosen on dev and never on test, which runs it would start,
what it keeps on disk, and the table's means, sample standard deviations and differences in
units of the pooled seed spread."""
import collections
import json
import math
import os
import statistics
import sys
import textwrap

import pytest

from bench import pretraining_ablation as ablation

# A stand-in for finetune.py whose dev and test disagree: on dev seed 0 is best at 3e-4 and
# seed 1 at 1e-4, on test every seed is best at 1e-3. It writes what finetune.py writes
# (results.json, metrics.jsonl) and one line per call to calls.txt beside --out's parent.
FAKE_FINETUNE = textwrap.dedent("""
    import json, os, sys
    argv = sys.argv[1:]
    value = lambda flag: argv[argv.index(flag) + 1]
    lr, seed, out = float(value("--lr")), int(value("--seed")), value("--out")
    dev = {(0, 1e-4): 0.70, (0, 3e-4): 0.80, (0, 1e-3): 0.60,
           (1, 1e-4): 0.85, (1, 3e-4): 0.75, (1, 1e-3): 0.65}[seed, lr]
    test = {1e-4: 0.50, 3e-4: 0.55, 1e-3: 0.95}[lr]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        for epoch, score in enumerate((dev - 0.1, dev, dev - 0.05), 1):
            f.write(json.dumps({"kind": "train", "loss": 1.0 / epoch}) + "\\n")
            f.write(json.dumps({"kind": "eval", "split": "dev", "accuracy": score}) + "\\n")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"best": {"score": dev, "epoch": 2.0}, "test": {"accuracy": test},
                   "train_minutes": 0.01}, f)
    with open(os.path.join(os.path.dirname(os.path.dirname(out)), "calls.txt"), "a") as f:
        f.write(" ".join(argv) + "\\n")
""")


@pytest.fixture
def fake_finetune(tmp_path, monkeypatch):
    script = tmp_path / "fake_finetune.py"
    script.write_text(FAKE_FINETUNE)
    monkeypatch.setattr(ablation, "FINETUNE", [sys.executable, str(script)])
    return tmp_path


def run(tmp_path, *flags):
    return ablation.main(["--starts", "random-init", "--tasks", "trec", "--seeds", "0", "1",
                          "--lr-grid", "1e-4", "3e-4", "1e-3", "--out", str(tmp_path / "runs"),
                          "--results", str(tmp_path / "results"), *flags])


def calls(tmp_path):
    path = tmp_path / "runs" / "trec" / "calls.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_the_rate_is_chosen_on_dev_and_only_its_test_score_counts(fake_finetune, capsys):
    tmp_path = fake_finetune
    assert run(tmp_path, "--parallel", "2") == 0
    assert len(calls(tmp_path)) == 2 * 3                       # two seeds, three rates
    numbers = json.loads((tmp_path / "results" / "results.json").read_text())["tasks"]
    row = numbers["trec"]["random-init"]
    assert row["rates"] == {"0": 3e-4, "1": 1e-4}, row         # dev's choice, seed by seed
    assert math.isclose(row["mean"], (55.0 + 50.0) / 2), row   # their test scores, not 95
    assert math.isclose(row["dev_mean"], (80.0 + 85.0) / 2)
    table = (tmp_path / "results" / "table.md").read_text()
    assert "| random init | 52.5 +- 3.5 | 2 | 3e-04, 1e-04 | 82.5 |" in table, table
    assert "| TREC question type, 6 classes, 4,305 train | random init | 77.5 (2) | " \
        "77.5 (2) | 62.5 (2) |" in table                       # the dev grid, mean over seeds
    record = json.loads((tmp_path / "results" / "trec" /
                         "random-init-seed0-lr3e-04.json").read_text())
    assert record["dev_curve"] == [70.0, 80.0, 75.0] and record["last_train_loss"] == 1 / 3
    assert math.isclose(record["test"], 55.0) and record["best_epoch"] == 2.0
    assert 0 < record["cpu_minutes"] < 1                       # the fake's own CPU time
    capsys.readouterr()
    # finished runs are kept: nothing runs again, unless --force
    assert run(tmp_path, "--parallel", "1") == 0 and len(calls(tmp_path)) == 6
    assert run(tmp_path, "--parallel", "1", "--force") == 0 and len(calls(tmp_path)) == 12


def test_a_seed_enters_the_table_only_once_its_whole_grid_has_run(fake_finetune):
    tmp_path = fake_finetune
    assert run(tmp_path, "--parallel", "1") == 0
    os.remove(tmp_path / "results" / "trec" / "random-init-seed1-lr1e-03.json")
    text, numbers = ablation.table(ablation.parse_args(
        ["--starts", "random-init", "--tasks", "trec", "--lr-grid", "1e-4", "3e-4", "1e-3",
         "--results", str(tmp_path / "results")]))
    assert numbers["trec"]["random-init"]["seeds"] == 1
    assert numbers["trec"]["random-init"]["pending_seeds"] == [1]
    assert "| 1 (1 pending) | 3e-04 |" in text
    # the run's folder is still there: it is recorded again, not repeated
    assert run(tmp_path, "--parallel", "1") == 0 and len(calls(tmp_path)) == 6
    record = tmp_path / "results" / "trec" / "random-init-seed1-lr1e-03.json"
    assert json.loads(record.read_text())["cpu_minutes"] is None       # not measured then


def test_select_reads_dev_alone_and_breaks_ties_to_the_lower_rate():
    def runs(**dev):
        return {float(lr): {"lr": float(lr), "dev": d, "test": -d} for lr, d in dev.items()}
    grid = [1e-4, 3e-4]
    assert ablation.select(runs(**{"1e-4": 80.0, "3e-4": 81.0}), grid)["lr"] == 3e-4
    assert ablation.select(runs(**{"1e-4": 80.0, "3e-4": 80.0}), grid)["lr"] == 1e-4
    assert ablation.select(runs(**{"1e-4": 80.0}), grid) is None          # 3e-4 not yet run


def write_record(args, task, start, seed, lr, dev, test):
    ablation.write_json(ablation.record_path(args, task, start, seed, lr),
                        {"task": task, "start": start, "seed": seed, "lr": lr, "dev": dev,
                         "test": test})


def test_table_means_stds_and_differences(tmp_path):
    args = ablation.parse_args(["--tasks", "trec", "--lr-grid", "1e-4", "--results",
                                str(tmp_path)])
    scores = {"brown-mlm-nsp": [80, 82, 84], "brown-mlm": [79, 80, 81],
              "random-init": [70, 71, 75]}
    for start, values in scores.items():
        for seed, value in zip(args.seeds, values):
            write_record(args, "trec", start, seed, 1e-4, dev=value - 1, test=value)
    text, numbers = ablation.table(args)
    pretrained, scratch = numbers["trec"]["brown-mlm-nsp"], numbers["trec"]["random-init"]
    assert math.isclose(pretrained["mean"], 82.0) and math.isclose(scratch["mean"], 72.0)
    assert math.isclose(pretrained["std"], statistics.stdev([80, 82, 84]))      # sample std
    pooled = math.sqrt((statistics.stdev([80, 82, 84]) ** 2
                        + statistics.stdev([70, 71, 75]) ** 2) / 2)
    assert math.isclose(pretrained["difference"], 10.0)
    assert math.isclose(pretrained["in_stds"], 10.0 / pooled)
    assert pretrained["best_on_dev"] and not numbers["trec"]["brown-mlm"]["best_on_dev"]
    assert "| TREC question type, 6 classes, 4,305 train | MLM + NSP, Brown (best on dev) | " \
        "82.0 +- 2.0 | 3 | 1e-04, 1e-04, 1e-04 | 81.0 | +10.0 (" in text, text
    assert "| MLM + NSP, sotu-wiki | not run | 0 |" in text      # a start not yet run
    write_record(args, "trec", "brown-mlm-nsp", 3, 1e-4, dev=85, test=86)   # an earlier seed
    _, numbers = ablation.table(args)
    assert numbers["trec"]["brown-mlm-nsp"]["seeds"] == 4
    assert math.isclose(numbers["trec"]["brown-mlm-nsp"]["mean"], 83.0)


def test_only_missing_runs_are_started_and_random_init_needs_no_pretraining(tmp_path):
    args = ablation.parse_args(["--tasks", "trec", "sentiment-1k", "--seeds", "0", "--starts",
                                "brown-mlm", "random-init", "--lr-grid", "1e-4", "1e-3",
                                "--out", str(tmp_path / "runs"),
                                "--results", str(tmp_path / "results")])
    jobs = ablation.pretraining_jobs(args)
    assert len(jobs) == 1 and "--no-nsp" in jobs[0].cmd and "--resume" not in jobs[0].cmd
    runs = ablation.finetune_jobs(args)
    assert len(runs) == 2 * 2 * 2                           # tasks x starts x rates
    scratch = [job for job in runs if "--from-scratch" in job.cmd]
    assert len(scratch) == 4 and all(job.needs is None for job in scratch)
    assert all(job.cmd[job.cmd.index("--model") + 1] == str(tmp_path / "runs" / "random-init")
               for job in scratch)
    assert all(job.needs == jobs[0].out for job in runs if job not in scratch)
    # each run's epochs given once: the task's (finetune.py would take the last of two)
    for job in runs:
        assert job.cmd.count("--epochs") == 1
        epochs = 10 if "--max-train-examples" in job.cmd else 3
        assert finetune_args(job.cmd).epochs == [epochs]
    write_record(args, "trec", "random-init", 0, 1e-3, dev=1, test=1)
    assert len(ablation.finetune_jobs(args)) == 7
    # an interrupted pretraining run is resumed, a finished one not started again
    touch(tmp_path / "runs" / "pretrain-brown-mlm" / "checkpoint" / "trainer_state.json")
    assert "--resume" in ablation.pretraining_jobs(args)[0].cmd
    touch(tmp_path / "runs" / "pretrain-brown-mlm" / "eval.json", "{}")
    assert ablation.pretraining_jobs(args) == []
    assert json.loads((tmp_path / "results" / "pretrain-brown-mlm.json").read_text()) == {}


def finetune_args(cmd):
    import finetune
    return finetune.parse_args(cmd[cmd.index(ablation.FINETUNE[1]) + 1:])


def touch(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_random_init_has_the_pretrained_runs_architecture_and_vocab(tmp_path):
    """The folder random init fine-tunes from holds the config train.py builds from the same
    flags (so it is the pretrained starts' architecture) and Brown's vocab."""
    import train
    args = ablation.parse_args(["--out", str(tmp_path)])
    folder = ablation.random_init_folder(args)
    pretraining = train.parse_args([*ablation.PRETRAIN, "--out", str(tmp_path / "pretrain")])
    written = ablation.BertConfig.from_json_file(folder)
    assert written == train.model_config(pretraining, written.vocab_size)
    with open(os.path.join(ablation.REPOSITORY, ablation.BROWN_VOCAB), encoding="utf-8") as f:
        assert (tmp_path / "random-init" / "vocab.txt").read_text(encoding="utf-8") == f.read()
    assert written.vocab_size == 8192


def test_a_run_that_needs_a_pretraining_waits_for_it_and_not_after_a_failure(tmp_path):
    def job(name, code, needs=None, seconds=0.1):
        # sleeps, writes <its folder>/ok and exits `code`; exits 3 if what it needs has no ok
        needed = str(tmp_path / needs / "ok") if needs else ""
        script = (f"import os, sys, time\ntime.sleep({seconds})\n"
                  f"if {needed!r} and not os.path.exists({needed!r}): sys.exit(3)\n"
                  f"open({str(tmp_path / name / 'ok')!r}, 'w').close()\nsys.exit({code})")
        return ablation.Job([sys.executable, "-c", script], str(tmp_path / name),
                            needs and str(tmp_path / needs))
    jobs = [job("pretrain", 0, seconds=1.0), job("waits", 0, "pretrain"), job("free", 0)]
    ablation.run_all(jobs, parallel=2)
    assert all((tmp_path / name / "ok").exists() for name in ("pretrain", "waits", "free"))
    failed = [job("bad", 1), job("after-bad", 0, "bad")]
    with pytest.raises(SystemExit, match="some runs failed"):
        ablation.run_all(failed, parallel=2)
    assert not (tmp_path / "after-bad").exists()               # never started


def test_split_rates_count_the_evaluative_words_the_vocab_splits(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film",
                                 "good", "aw", "##ful", ","]) + "\n")
    tokenizer = ablation.BertTokenizer(str(vocab), do_lower_case=True)
    counts = collections.Counter({"good": 20, "awful": 1, "the": 100})
    rates = ablation.split_rates(["The film was AWFUL, good!"], tokenizer, {"good", "awful"},
                                 counts, reference=tokenizer)
    evaluative, other = rates["evaluative"], rates["other"]
    assert evaluative["occurrences"] == 2 and other["occurrences"] == 3     # the, film, was
    assert evaluative["split"] == 50.0                     # aw ##ful, not good
    assert math.isclose(other["split"], 100 / 3)           # was: [UNK]
    assert evaluative["rare_in_corpus"] == 50.0 and math.isclose(other["rare_in_corpus"], 200 / 3)
    assert evaluative["reference_split"] == 50.0


def test_the_polarity_probe_finds_polarity_only_where_the_features_hold_it():
    import numpy
    rng = numpy.random.default_rng(0)
    positive = rng.random(400) < 0.6
    features = rng.normal(size=(400, 16))
    assert abs(ablation.polarity_probe(features, positive) - 0.5) < 0.1      # noise: chance
    features[:, 3] += numpy.where(positive, 2.0, -2.0)                       # one direction
    assert ablation.polarity_probe(features, positive) > 0.95


def test_nearest_rank_and_sentence_groups_by_words_and_length(tmp_path):
    import numpy
    embeddings = numpy.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.7, 0.7]])
    assert ablation.nearest_rank(embeddings, 0, 1) == 0                      # the nearest
    assert ablation.nearest_rank(embeddings, 0, 2) == 2                      # behind 1 and 3
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film",
                                "good", "aw", "##ful"]) + "\n")
    tokenizer = ablation.BertTokenizer(str(vocab), do_lower_case=True)
    lexicon, counts = {"good": 1.9, "awful": -2.0}, collections.Counter(good=50, awful=50)
    group = ablation.sentence_group
    assert group(tokenizer, lexicon, counts, "the film") == "none"
    assert group(tokenizer, lexicon, counts, "good film") == "whole and common in Brown"
    assert group(tokenizer, lexicon, counts, "good, awful") == "split or rare in Brown"
    assert group(tokenizer, lexicon, collections.Counter(good=3), "good") == \
        "split or rare in Brown"
    assert ablation.length_group(tokenizer, " ".join(["the"] * 38)) == "40 pieces or fewer"
    assert ablation.length_group(tokenizer, " ".join(["the"] * 39)) == "longer than 40 pieces"


def test_tapt_trains_on_the_tasks_training_text_alone(tmp_path, monkeypatch):
    """A TAPT start's text is the training split's sentences (labels dropped, never a dev or
    test sentence); for a 1,000-example task exactly the seed's subset finetune.py trains on."""
    import argparse

    from nanobert.data import datasets
    from nanobert.training.tasks import limit_examples
    Example = collections.namedtuple("Example", "text_a text_b label")
    train = [Example(f"train  sentence {i}", None, i % 2) for i in range(1500)]
    dev, test = [Example("a dev sentence", None, 0)], [Example("a test sentence", None, 1)]
    monkeypatch.setattr(datasets, "load", lambda name, task: ((train, dev, test), [0, 1], ""))
    path = tmp_path / "train.txt"
    ablation.write_tapt_text(str(path), "sentiment", 0)
    documents = path.read_text(encoding="utf-8").split("\n\n")
    assert documents[:2] == ["train sentence 0", "train sentence 1"]    # one a document
    assert len(documents) == 1500 + 1 and documents[-1] == ""
    for seed in (0, 1):
        ablation.write_tapt_text(str(path), "sentiment-1k", seed)
        written = path.read_text(encoding="utf-8").split("\n\n")[:-1]
        args = argparse.Namespace(max_train_examples=1000, max_eval_examples=None, seed=seed)
        subset = limit_examples(args, {"train": (train, {})})["train"][0]
        assert written == [" ".join(e.text_a.split()) for e in subset]
        assert len(set(written)) == 1000 and not {"a dev sentence", "a test sentence"} & \
            set(written)
    assert ablation.training_text("trec-1k", 0) != ablation.training_text("trec-1k", 1)


def test_a_tapt_start_continues_its_base_checkpoint_per_task_and_seed(tmp_path, monkeypatch):
    args = ablation.parse_args(["--tasks", "sentiment", "sentiment-1k", "conll2003", "--seeds",
                                "0", "1", "--starts", "brown-tapt", "--lr-grid", "1e-4",
                                "--out", str(tmp_path / "runs"),
                                "--results", str(tmp_path / "results")])
    base = str(tmp_path / "runs" / "pretrain-brown-mlm-nsp")
    tapt = tmp_path / "runs" / "pretrain-brown-tapt"
    from nanobert.data import datasets
    Example = collections.namedtuple("Example", "text_a text_b label")
    examples = [Example(f"sentence {i}", None, 0) for i in range(1200)]
    monkeypatch.setattr(datasets, "load", lambda name, task: ((examples, [], []), [0], ""))
    jobs = ablation.pretraining_jobs(args)
    # the base pretraining first (missing here), then one TAPT run per full task and one per
    # seed of a 1,000-example task; none for CoNLL-2003
    assert [job.out for job in jobs] == [base] + [str(tapt / key) for key in (
        "sentiment", "sentiment-1k-seed0", "sentiment-1k-seed1")]
    for job in jobs[1:]:
        assert job.needs == base
        cmd = job.cmd
        assert cmd[cmd.index("--init-from") + 1] == os.path.join(base, "checkpoint")
        assert cmd[cmd.index("--data") + 1] == os.path.join(job.out, "train.txt")
        assert "--no-nsp" in cmd and cmd[cmd.index("--steps") + 1] == "2000"
        assert os.path.isfile(os.path.join(job.out, "train.txt"))
    assert (tapt / "sentiment-1k-seed0" / "train.txt").read_text() != \
        (tapt / "sentiment-1k-seed1" / "train.txt").read_text()
    runs = ablation.finetune_jobs(args)
    assert len(runs) == 2 * 2 and not any("conll2003" in job.cmd for job in runs)
    for job in runs:
        key = ablation.tapt_key("sentiment-1k" if "--max-train-examples" in job.cmd else
                                "sentiment", int(job.cmd[job.cmd.index("--seed") + 1]))
        assert job.needs == str(tapt / key)
        assert job.cmd[job.cmd.index("--model") + 1] == str(tapt / key / "checkpoint")
    # the table leaves out the tasks a start does not fine-tune
    write_record(args, "sentiment", "brown-tapt", 0, 1e-4, dev=70, test=71)
    text, _ = ablation.table(args)
    assert "(TAPT) (best on dev) | 71.0 +- 0.0 | 1 |" in text, text
    assert not [line for line in text.splitlines() if "CoNLL" in line and "TAPT" in line]


def test_longer_pretraining_is_its_own_run_and_folder(tmp_path):
    args = ablation.parse_args(["--tasks", "sentiment", "--seeds", "0", "--starts",
                                "brown-mlm-nsp", "brown-mlm-nsp-30k", "--out",
                                str(tmp_path / "runs"), "--results", str(tmp_path / "results")])
    jobs = ablation.pretraining_jobs(args)
    steps = {os.path.basename(job.out): job.cmd[job.cmd.index("--steps") + 1] for job in jobs}
    assert steps == {"pretrain-brown-mlm-nsp": "10000", "pretrain-brown-mlm-nsp-30k": "30000"}
    recipe = [[c for c in job.cmd if c not in ("10000", "30000", job.out)] for job in jobs]
    assert recipe[0] == recipe[1]                                  # the same recipe otherwise
    models = {job.cmd[job.cmd.index("--model") + 1] for job in ablation.finetune_jobs(args)}
    assert models == {os.path.join(job.out, "checkpoint") for job in jobs}


def test_the_continued_pretraining_starts_from_the_30k_checkpoint_with_new_instances(tmp_path):
    """brown-mlm-nsp-60k: the 30,000-step run first (it waits for it), then 30,000 more steps
    from its checkpoint under the same recipe but --seed 1 (other pairs and masks), given once."""
    args = ablation.parse_args(["--tasks", "sentiment", "--seeds", "0", "--starts",
                                "brown-mlm-nsp-60k", "--out", str(tmp_path / "runs"),
                                "--results", str(tmp_path / "results")])
    base, more = ablation.pretraining_jobs(args)
    assert base.out == str(tmp_path / "runs" / "pretrain-brown-mlm-nsp-30k")
    assert more.needs == base.out and more.out == str(tmp_path / "runs" /
                                                      "pretrain-brown-mlm-nsp-60k")
    assert more.cmd[more.cmd.index("--init-from") + 1] == os.path.join(base.out, "checkpoint")
    assert more.cmd.count("--seed") == 1 and more.cmd[more.cmd.index("--seed") + 1] == "1"
    assert base.cmd[base.cmd.index("--seed") + 1] == "0"
    same = [c for c in more.cmd if c not in ("--init-from", os.path.join(base.out, "checkpoint"),
                                             "1", more.out)]
    assert same == [c for c in base.cmd if c not in ("0", base.out)]   # the recipe otherwise
    [job] = [j for j in ablation.finetune_jobs(args) if "lr1e-04" in j.out]
    assert job.cmd[job.cmd.index("--model") + 1] == os.path.join(more.out, "checkpoint")


def test_a_layer_decay_start_fine_tunes_its_base_checkpoint_with_the_flag(tmp_path):
    """brown-mlm-nsp-30k-ld0.8 pretrains nothing of its own: it waits for (and, alone, asks
    for) the 30,000-step run and fine-tunes that checkpoint with --layer-decay 0.8, its
    records under its own name."""
    args = ablation.parse_args(["--tasks", "sentiment", "--seeds", "0", "--starts",
                                "brown-mlm-nsp-30k-ld0.8", "--lr-grid", "1e-4", "--out",
                                str(tmp_path / "runs"), "--results", str(tmp_path / "results")])
    [pretraining] = ablation.pretraining_jobs(args)
    base = str(tmp_path / "runs" / "pretrain-brown-mlm-nsp-30k")
    assert pretraining.out == base and pretraining.cmd[pretraining.cmd.index("--steps") + 1] \
        == "30000"
    jobs = ablation.finetune_jobs(args)         # --lr-grid and the start's own rate above it
    assert [job.cmd[job.cmd.index("--lr") + 1] for job in jobs] == ["0.0001", "0.003"]
    for job in jobs:
        assert job.needs == base and job.cmd[job.cmd.index("--model") + 1] == \
            os.path.join(base, "checkpoint")
        assert job.cmd[job.cmd.index("--layer-decay") + 1] == "0.8"
    assert jobs[0].out.endswith(os.path.join("brown-mlm-nsp-30k-ld0.8-seed0", "lr1e-04"))
    # the choice waits for the added rate too, then reads dev over both
    write_record(args, "sentiment", "brown-mlm-nsp-30k-ld0.8", 0, 1e-4, dev=70, test=71)
    assert ablation.chosen_runs(args, "sentiment", "brown-mlm-nsp-30k-ld0.8") == ({}, [0])
    write_record(args, "sentiment", "brown-mlm-nsp-30k-ld0.8", 0, 3e-3, dev=72, test=60)
    chosen, _ = ablation.chosen_runs(args, "sentiment", "brown-mlm-nsp-30k-ld0.8")
    assert chosen[0]["lr"] == 3e-3 and chosen[0]["test"] == 60
    assert "| dev at 1e-04 | dev at 3e-03 |" in ablation.grid_table(args)
    plain = ablation.parse_args(["--tasks", "sentiment", "--seeds", "0", "--starts",
                                 "brown-mlm-nsp-30k", "--out", str(tmp_path / "runs")])
    assert not any("--layer-decay" in job.cmd for job in ablation.finetune_jobs(plain))


def test_the_sentence_probe_pools_real_pieces_and_reads_a_linear_label():
    import numpy

    from nanobert import BertConfig, BertModel
    tokenizer = ablation.BertTokenizer(os.path.join(ablation.REPOSITORY, ablation.BROWN_VOCAB),
                                       do_lower_case=True)
    model = BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32), seed=0).eval()
    texts = ["a short one", "a much longer sentence that pads the short one in its batch"]
    together = ablation.sentence_features(model, tokenizer, texts)
    alone = numpy.concatenate([ablation.sentence_features(model, tokenizer, [t]) for t in texts])
    assert together.shape == (2, 16)
    numpy.testing.assert_allclose(together, alone, atol=1e-5)     # padding never pooled
    rng = numpy.random.default_rng(0)
    labels = rng.random(600) < 0.5
    features = rng.normal(size=(600, 8))
    chance = ablation.linear_probe(features[:400], labels[:400], features[400:], labels[400:])
    features[:, 2] += numpy.where(labels, 1.5, -1.5)
    found = ablation.linear_probe(features[:400], labels[:400], features[400:], labels[400:])
    assert abs(chance - 0.5) < 0.1 < 0.9 < found, (chance, found)


def test_naive_bayes_learns_the_words_and_word_pairs_of_each_label(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) + "\n")
    tokenizer = ablation.BertTokenizer(str(vocab), do_lower_case=True)
    assert ablation.ngrams(tokenizer, "Not good, film") == {"not", "good", ",", "film",
                                                            "not good", "good ,", ", film"}
    Example = collections.namedtuple("Example", "text_a label")
    train = [Example("a good film", "pos"), Example("good acting", "pos"),
             Example("a bad film", "neg"), Example("not good at all", "neg"),
             Example("bad acting", "neg")]
    predict = ablation.naive_bayes(train, 0.1, tokenizer)
    assert predict("good") == "pos" and predict("bad") == "neg"
    assert predict("unseen") == "neg"                             # the prior: 3 of 5 are neg
    assert predict("not good") == "neg"                           # the pair outweighs "good"
