"""The derivations in docs/backward.md and the README's example run: every ```python block,
in order, in one namespace per document (a block may use an earlier block's names). A
failing block is named by its line in the document. And the document keeps a section for
every forward/backward pair of ops.py, so it cannot silently lose one."""
import pathlib
import re

import pytest

from nanobert.model import ops

ROOT = pathlib.Path(__file__).resolve().parent.parent
BACKWARD = ROOT / "docs" / "backward.md"
README = ROOT / "README.md"
# the op pairs every derivation must cover (issue 19's list)
OPS = ("cross_entropy", "mse", "bce_with_logits", "tanh", "layernorm", "gelu", "linear",
       "softmax", "self_attention", "dropout", "embedding")


def python_blocks(path, section=None):
    """[(first line of the code, source)] of every ```python block of a Markdown file, or only
    of those under the heading `section` (up to the next heading)."""
    blocks, source, start = [], None, 0
    inside = section is None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if source is None and line.startswith("#") and section is not None:
            inside = line.lstrip("#").strip() == section
        if source is None and line.strip() == "```python" and inside:
            source, start = [], number + 1
        elif source is not None and line.strip() == "```":
            blocks.append((start, "\n".join(source) + "\n"))
            source = None
        elif source is not None:
            source.append(line)
    assert source is None, f"{path.name}: the ```python block at line {start} is not closed"
    return blocks


def run_blocks(path, section=None):
    namespace = {"__name__": f"docs:{path.name}"}
    blocks = python_blocks(path, section)
    where = f" under {section!r}" if section else ""
    assert blocks, f"{path.name} has no ```python block{where}"
    for line, source in blocks:
        try:
            exec(compile(source, f"{path.name}:{line}", "exec"), namespace)
        except Exception as e:
            pytest.fail(f"{path.name}, the python block at line {line}: "
                        f"{type(e).__name__}: {e}")
    return namespace


def test_every_code_block_of_the_derivations_runs(capsys):
    run_blocks(BACKWARD)
    printed = capsys.readouterr().out
    assert "self-attention" in printed and "whole model, worst" in printed


def test_the_readme_gradient_check_example_runs(capsys):
    namespace = run_blocks(README, "Check the gradient of your own op")
    assert "rmsnorm_backward" in namespace and "'gamma':" in capsys.readouterr().out


def heading_anchor(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces -> -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_links_each_idea_to_a_section_that_exists():
    anchors = {heading_anchor(line.lstrip("#")) for line in BACKWARD.read_text().splitlines()
               if line.startswith("#")}
    links = re.findall(r"\(docs/backward\.md#([^)]+)\)", README.read_text())
    assert len(links) >= 15, links
    missing = sorted(set(links) - anchors)
    assert not missing, f"README links to sections docs/backward.md does not have: {missing}"


@pytest.mark.parametrize("op", OPS)
def test_every_op_pair_has_a_derivation_linked_to_ops_py(op):
    text = BACKWARD.read_text()
    for name in (f"{op}_forward", f"{op}_backward"):
        assert hasattr(ops, name), f"ops.py has no {name}: update docs/backward.md and OPS"
        assert f"[`{name}`](../nanobert/model/ops.py)" in text, \
            f"docs/backward.md has no section that links {name}"


def test_the_failure_names_the_line_of_the_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# t\n\n```python\nx = 1\n```\n\ntext\n\n```python\nassert x == 2, x\n```\n")
    with pytest.raises(pytest.fail.Exception, match=r"doc.md, the python block at line 10: "
                                                    r"AssertionError: 1"):
        run_blocks(doc)
    assert re.search("x = 1", python_blocks(doc)[0][1])
