"""docs/walkthrough.md cannot drift: its list is one traced step of train.py in reference mode.

The page lists every project function one step runs as items "- `file:line` qualified.name
(lines) — what it does": the math first (bench.reading_cost.is_math: the ops, the encoder and
heads that compose them, the update's math), then the harness, each in the order first called.
A step is traced here (bench.reading_cost.train_py_step) and the items must equal the trace's,
in that order; the math must come before the first harness heading; the page's Mermaid diagram
of one step's tensors must be the one a traced step draws (step_diagram); the page must also
name every file the fast mode runs. When only line numbers moved,
`python -m bench.reading_cost --walkthrough-update docs/walkthrough.md` rewrites them (and the
diagram). In the learner's quick tier (pytest -m learner)."""
import pathlib

import pytest

from bench.reading_cost import (DIAGRAM_MARKS, ROOT, between, executed_functions, is_math,
                                math_count, page_items, per_file, step_diagram, train_py_step,
                                update_walkthrough, walkthrough_items)

pytestmark = pytest.mark.learner           # the learner's quick tier (README)
PAGE = pathlib.Path(ROOT) / "docs" / "walkthrough.md"
HARNESS = "## The harness"       # the heading the harness's items come after
REGENERATE = ("regenerate: python -m bench.reading_cost --walkthrough-update docs/walkthrough.md "
              "(line numbers and lengths; descriptions kept), or, where functions were added or "
              "removed, write their items from python -m bench.reading_cost --walkthrough")


@pytest.fixture(scope="module")
def reference_step():
    return train_py_step(reference=True)


def first_difference(text, trace_items):
    """None where the page's list equals trace_items in order, else a message naming the first
    item that differs (its line on the page) and how to regenerate."""
    page = page_items(text)
    for n, (ours, traced) in enumerate(zip([item for _, item, _ in page], trace_items)):
        if ours != traced:
            return (f"docs/walkthrough.md line {page[n][0] + 1}, item {n + 1}: the page has "
                    f"{ours}, one traced step of train.py runs {traced}\n{REGENERATE}")
    if len(page) != len(trace_items):
        extra = ([f"the page lists more: {page[len(trace_items)][1]} (line "
                  f"{page[len(trace_items)][0] + 1})"] if len(page) > len(trace_items)
                 else [f"the step runs more: {trace_items[len(page)]}"])
        return (f"docs/walkthrough.md has {len(page)} items, the traced step "
                f"{len(trace_items)} functions; {extra[0]}\n{REGENERATE}")
    return None


def test_the_page_lists_the_traced_step_function_by_function(reference_step):
    problem = first_difference(PAGE.read_text(), walkthrough_items(reference_step))
    assert problem is None, problem


def test_the_math_comes_first_and_the_harness_in_its_own_section(reference_step):
    text = PAGE.read_text()
    lines = text.splitlines()
    harness = next((n for n, line in enumerate(lines) if line.startswith(HARNESS)), None)
    assert harness is not None, f"docs/walkthrough.md has no heading {HARNESS!r}"
    items = page_items(text)
    math = math_count(reference_step)
    assert math > 40 and all(n < harness for n, _, _ in items[:math]), \
        "the math's items must all come before the harness's heading"
    assert all(n > harness for n, _, _ in items[math:]), \
        "the harness's items must all come after its heading"
    first_op = next(i for i, (_, item, _) in enumerate(items) if "model/ops.py" in item)
    assert first_op < 6, f"the first ops.py function is item {first_op + 1}"


def test_the_diagram_is_the_traced_steps():
    lines = PAGE.read_text().splitlines()
    start, end = between(lines, DIAGRAM_MARKS)
    drawn = step_diagram()
    assert lines[start + 1:end] == drawn, (
        "docs/walkthrough.md's diagram is not the traced step's; regenerate: python -m "
        "bench.reading_cost --walkthrough-update docs/walkthrough.md\n" + "\n".join(drawn))
    assert any("encoder_layer_forward × 2" in line for line in drawn), drawn


def test_every_item_says_what_its_function_does():
    bare = [item for _, item, description in page_items(PAGE.read_text())
            if len(description.split()) < 2]
    assert not bare, f"items of docs/walkthrough.md without a description: {bare}"


def test_the_page_names_every_file_the_fast_mode_runs():
    text = PAGE.read_text()
    files = per_file(executed_functions(reference=False))
    missing = [path for path in files if path not in text]
    assert not missing, (f"docs/walkthrough.md's section on the fast mode names no {missing}, "
                         f"which a fast step runs (python -m bench.reading_cost)")


def test_the_page_tells_how_to_step_through_it():
    text = PAGE.read_text()
    for needed in ("python -m pdb train.py --reference-ops", "NANOBERT_REFERENCE=1",
                   "never hit"):
        assert needed in text, f"docs/walkthrough.md does not say {needed!r}"

# --------------------------------------------------------- the check and the update themselves
# on a page made from the trace (these hold whether or not docs/walkthrough.md is up to date)


def made_page(functions):
    items = walkthrough_items(functions)
    return ("# A step\n\n```text\n- `train.py:1` not_an_item (1) — inside a block\n```\n\n"
            + "".join(f"- {item} — what {item.split()[1]} does\n" for item in items))


def test_a_moved_line_or_a_missing_item_is_caught(reference_step):
    items = walkthrough_items(reference_step)
    text = made_page(reference_step)
    assert first_difference(text, items) is None
    path, line, name, _ = reference_step[40]
    moved = text.replace(f"`{path}:{line}` {name} (", f"`{path}:{line + 1}` {name} (", 1)
    problem = first_difference(moved, items)
    assert problem is not None and f"has `{path}:{line + 1}` {name}" in problem \
        and "--walkthrough-update" in problem, problem
    name = items[40].split()[1]                        # the page's order: math first
    deleted = text.replace(f"- {items[40]} — what {name} does\n", "", 1)
    problem = first_difference(deleted, items)
    assert problem is not None and f"runs {items[40]}" in problem, problem
    problem = first_difference(text + f"- {items[0]} — again\n", items)
    assert problem is not None and "the page lists more" in problem, problem


def test_the_update_rewrites_moved_lines_and_keeps_descriptions(reference_step):
    text = made_page(reference_step)
    path, line, name, lines = reference_step[7]
    moved = text.replace(f"`{path}:{line}` {name} ({lines})",
                         f"`{path}:{line + 9}` {name} ({lines + 2})", 1)
    assert moved != text
    assert update_walkthrough(moved, reference_step) == text


def test_the_update_refuses_added_or_removed_functions_naming_them(reference_step):
    text = made_page(reference_step)
    fewer = [f for f in reference_step if f[2] != "erf"]
    with pytest.raises(ValueError, match=r"no longer runs:\n  - `nanobert/model/ops.py:\d+` erf"):
        update_walkthrough(text, fewer)
    more = reference_step + [("nanobert/model/ops.py", 999, "rms_norm_forward", 9)]
    with pytest.raises(ValueError, match=r"write their descriptions\):\n  \+ `nanobert/model/"
                                         r"ops.py:999` rms_norm_forward \(9\)"):
        update_walkthrough(text, more)
    swapped = list(reference_step)
    first, second = [n for n, f in enumerate(reference_step) if is_math(f[0], f[2])][1:3]
    swapped[first], swapped[second] = swapped[second], swapped[first]
    with pytest.raises(ValueError, match="another order: item 2"):
        update_walkthrough(text, swapped)
