"""The pages cannot drift from the code: README.md and every docs/*.md page.

- Every fenced code block runs here, or is marked. ```python blocks run in order, one namespace
  per page (a block may use an earlier block's names); a failing block is named by its line.
  Shell blocks (```bash, ```sh): each command (lines split at `&&`) is a project command whose
  `--help` must run (train.py, finetune.py, python -m nanobert... / bench...), a `pip install`
  whose pinned versions are those .ci/run installs, or a set-up step (venv, activate, ruff,
  pytest). ```text blocks are a command's output; a block without a language is a layout,
  and every path it names must exist.
- Markers, an HTML comment on the line just before a block (invisible on GitHub):
    <!-- illustrative -->              not run (a python block is still compiled and its
                                        imports resolved); for transcripts, examples that need
                                        a trained folder, hours-long commands, several machines
    <!-- run by tests/test_x.py -->     run by that test file, which must name the page
- Every relative link (and #anchor, GitHub's rules) resolves.
- Every --flag a page names for a project command is in that command's --help: the command is
  the one named in the same code span or command line, else the last one named earlier in the
  paragraph, else any project command.
And docs/backward.md keeps a section for every forward/backward pair of ops.py."""
import ast
import functools
import importlib.util
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

from nanobert.model import ops

ROOT = pathlib.Path(__file__).resolve().parent.parent
BACKWARD = ROOT / "docs" / "backward.md"
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
CI = ROOT / ".ci" / "run"
# the op pairs every derivation must cover (issue 19's list)
OPS = ("cross_entropy", "mse", "bce_with_logits", "tanh", "layernorm", "gelu", "linear",
       "softmax", "self_attention", "dropout", "embedding", "linear_gelu",
       "dropout_add_layernorm")
# what a page's python blocks must print (proof that they ran to the end)
PRINTS = {"backward.md": ("self-attention", "whole model, worst"), "README.md": ("loss 0.",),
          "correctness.md": ("'gamma':", "caught: rmsnorm: x: error")}
SHELL = ("bash", "sh", "console", "shell")
MARKER = re.compile(r"<!-- (illustrative|run by tests/\w+\.py) -->")
SETUP = (r"python3? -m venv \S+", r"\. \S+/bin/activate", r"ruff check \.", r"python -m pytest.*")
FLAG = re.compile(r"(?<![\w-])--[a-z][\w-]*")
# a project command named in text: python train.py, finetune.py, python -m nanobert.features
COMMAND = re.compile(r"(?<![\w/.-])(train\.py|finetune\.py)(?![\w-])"
                     r"|python3? -m ((?:nanobert|bench)(?:\.\w+)+)")


@dataclass
class Block:
    line: int        # the block's first line of code
    lang: str
    source: str
    marker: str      # "", "illustrative" or "run by tests/x.py"


def fenced_blocks(path):
    """Every fenced block of a Markdown page, with the marker on the line before its fence."""
    blocks, source, lang, start, marker, previous = [], None, "", 0, "", ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if source is None and line.lstrip().startswith("```"):
            lang, source, start = line.strip()[3:].strip(), [], number + 1
            found = MARKER.fullmatch(previous.strip())
            marker = found.group(1) if found else ""
        elif source is not None and line.strip() == "```":
            # a block inside a list item is indented with it
            blocks.append(Block(start, lang, textwrap.dedent("\n".join(source)) + "\n", marker))
            source = None
        elif source is not None:
            source.append(line)
        if line.strip():
            previous = line
    assert source is None, f"{path.name}: the block at line {start} is not closed"
    return blocks


def python_blocks(path, section=None):
    """[(first line of the code, source)] of the ```python blocks that are not illustrative,
    of a whole page or only of those under the heading `section` (up to the next heading)."""
    text = path.read_text().splitlines()
    blocks = [b for b in fenced_blocks(path) if b.lang == "python" and b.marker != "illustrative"]
    if section is not None:
        blocks = [b for b in blocks if section_of(text, b.line) == section]
    return [(b.line, b.source) for b in blocks]


def section_of(lines, number):
    """The heading above line `number` (1-based), outside fenced blocks."""
    heading, fence = None, False
    for line in lines[:number - 1]:
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            heading = line.lstrip("#").strip()
    return heading


def run_blocks(path, section=None, blocks=None):
    namespace = {"__name__": f"docs:{path.name}"}
    blocks = python_blocks(path, section) if blocks is None else blocks
    where = f" under {section!r}" if section else ""
    assert blocks, f"{path.name} has no ```python block{where}"
    for line, source in blocks:
        try:
            exec(compile(source, f"{path.name}:{line}", "exec"), namespace)
        except Exception as e:
            pytest.fail(f"{path.name}, the python block at line {line}: "
                        f"{type(e).__name__}: {e}")
    return namespace


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_block_of_the_page_runs(page, capsys, tmp_path, monkeypatch):
    blocks = [b for b in fenced_blocks(page) if b.lang == "python"]
    for b in blocks:
        if b.marker == "illustrative":   # it compiles, and what it imports exists
            tree = ast.parse(b.source, f"{page.name}:{b.line}")
            imports = ast.Module([n for n in tree.body if isinstance(n, (ast.Import,
                                                                         ast.ImportFrom))], [])
            exec(compile(imports, f"{page.name}:{b.line}", "exec"), {})
        elif b.marker.startswith("run by "):
            runner = ROOT / b.marker[len("run by "):]
            assert runner.is_file(), f"{page.name}:{b.line}: no {runner}"
            assert page.name in runner.read_text(), \
                f"{page.name}:{b.line}: {runner.name} does not name {page.name}"
    runnable = [(b.line, b.source) for b in blocks if not b.marker]
    if not runnable:
        return
    monkeypatch.chdir(tmp_path)    # whatever a block writes lands here
    run_blocks(page, blocks=runnable)
    printed = capsys.readouterr().out
    for expected in PRINTS.get(page.name, ()):
        assert expected in printed, f"{page.name}'s blocks did not print {expected!r}"


def test_every_page_with_expected_output_has_blocks_that_print_it():
    names = {p.name for p in PAGES}
    assert set(PRINTS) <= names, f"PRINTS names pages that do not exist: {set(PRINTS) - names}"


# ------------------------------------------------------------------------- commands and flags


def command_parts(source):
    """The commands of a shell block: `$ ` prompt lines where the block has prompts (the other
    lines are output), else every line; continuations joined, comments dropped, `&&` split."""
    lines = source.splitlines()
    if any(line.startswith("$ ") for line in lines):
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    parts = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            parts.append(words[:cut])
            words = words[cut + 1:]
    return [p for p in parts if p]


def project_command(words):
    """'train.py', 'finetune.py' or 'nanobert.x' / 'bench.x' for a python command of the
    project (environment variables and an mpiexec launcher stripped), else None."""
    while words and re.fullmatch(r"\w+=\S*", words[0]):
        words = words[1:]
    if words and words[0] == "mpiexec":
        words = words[words.index("python"):] if "python" in words else []
    if len(words) >= 2 and words[0] in ("python", "python3"):
        if words[1] in ("train.py", "finetune.py"):
            return words[1]
        if words[1] == "-m" and len(words) > 2 and re.match(r"(nanobert|bench)\.", words[2]):
            return words[2]
    return None


@functools.lru_cache(maxsize=None)
def help_flags(command):
    """The --flags of a project command's --help (its exit status asserted 0)."""
    if command.endswith(".py"):
        script = ROOT / command
        args = [sys.executable, str(script)]
    else:
        spec = importlib.util.find_spec(command)
        assert spec is not None, f"no module {command}"
        script = pathlib.Path(spec.origin)
        args = [sys.executable, "-m", command]
    # never run a module's main by accident: only one with a parser gets --help
    assert has_parser(script), f"{command} has no argparse --help"
    done = subprocess.run(args + ["--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"{command} --help failed:\n{done.stderr[-2000:]}"
    return frozenset(FLAG.findall(done.stdout)) | {"--help"}


def has_parser(script):
    """Whether a script parses its arguments (argparse, or nanobert's run_command wrapper)."""
    text = script.read_text()
    return "ArgumentParser" in text or "run_command(main)" in text


def all_commands():
    return ["train.py", "finetune.py"] + sorted(
        f"{package}.{path.stem}" for package in ("nanobert", "bench")
        for path in (ROOT / package).glob("*.py")
        if path.stem != "__init__" and has_parser(path)) + [
        "nanobert.data.pretraining_data"]


def ci_pins():
    """{package: version} of every `name==version` that .ci/run installs."""
    return dict(re.findall(r"([\w.-]+)==([\w.]+)", CI.read_text()))


def check_pip(words, where):
    pins = ci_pins()
    for word in words[2:]:
        name, _, version = word.partition("==")
        if version and name in pins:
            assert version == pins[name], f"{where}: {word}, but .ci/run installs " \
                                          f"{name}=={pins[name]}"
        if word.startswith("-e") or word.startswith(".["):
            extras = re.findall(r"\.\[([\w,]+)\]", word)
            declared = re.findall(r"^(\w+) = \[", (ROOT / "pyproject.toml").read_text(), re.M)
            for extra in (extras[0].split(",") if extras else []):
                assert extra in declared, f"{where}: no extra [{extra}] in pyproject.toml"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_shell_block_runs_or_is_marked(page):
    for b in fenced_blocks(page):
        if b.lang not in SHELL or b.marker == "illustrative":
            continue
        assert not b.marker.startswith("run by "), f"{page.name}:{b.line}: shell blocks run here"
        for words in command_parts(b.source):
            where, command = f"{page.name}:{b.line} `{shlex.join(words)}`", project_command(words)
            if command is not None:
                help_flags(command)        # its --help runs; its flags: the flag test
            elif words[:2] == ["pip", "install"]:
                check_pip(words, where)
            else:
                assert any(re.fullmatch(s, shlex.join(words)) for s in SETUP), \
                    f"{where} is not a command this test can run: mark the block " \
                    f"<!-- illustrative --> (see tests/test_docs.py)"


def flag_uses(page):
    """[(line, flag, command or None)] for every --flag of a page: in shell blocks by command
    line; in text by code span, then by the last command named earlier in the paragraph."""
    uses, lines = [], page.read_text().splitlines()
    for b in fenced_blocks(page):
        if b.lang in SHELL:
            for words in command_parts(b.source):
                command = project_command(words)
                if command is not None:
                    uses += [(b.line, flag, command) for flag in FLAG.findall(" ".join(words))]
                elif words[0] not in ("pip", "python", "python3") and words[:1] != ["mpiexec"]:
                    uses += [(b.line, flag, None) for flag in FLAG.findall(" ".join(words))]
        elif b.lang == "text":
            uses += [(b.line, flag, None) for flag in FLAG.findall(b.source)]
    paragraph, fence = [], False
    for number, line in enumerate(lines + [""], 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence or line.lstrip().startswith("```") or not line.strip():
            uses += paragraph_flags(paragraph)
            paragraph = []
        else:
            paragraph.append((number, line))
    return uses


def paragraph_flags(paragraph):
    uses, named = [], None
    text = "\n".join(line for _, line in paragraph)
    starts = [number for number, line in paragraph for _ in line + "\n"]
    spans = [(m.start(), m.end()) for m in re.finditer(r"`[^`]+`", text)]
    events = sorted([(m.start(), "command", m) for m in COMMAND.finditer(text)] +
                    [(m.start(), "flag", m) for m in FLAG.finditer(text)], key=lambda e: e[0])
    for at, kind, match in events:
        if kind == "command":       # named: its --help must run
            named = match.group(1) or match.group(2)
            uses.append((starts[at], "--help", named))
            continue
        span = next((s for s in spans if s[0] <= at < s[1]), None)
        before = text[span[0] + 1:at] if span else ""
        if span and re.match(r"\s*(pip|mpiexec -n \S+ (?!python))", before):
            continue                # a pip flag
        uses.append((starts[at], match.group(), named))
    return uses


def flag_problems(page):
    problems = []
    for line, flag, command in flag_uses(page):
        if command is not None:
            if flag not in help_flags(command):
                problems.append(f"{page.name}:{line}: {command} has no {flag} (its --help)")
        elif not any(flag in help_flags(c) for c in all_commands()):
            problems.append(f"{page.name}:{line}: no project command has {flag}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_flag_a_page_names_is_in_its_commands_help(page):
    problems = flag_problems(page)
    assert not problems, "\n".join(problems)


def test_the_flag_check_attributes_flags_to_their_command(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `python train.py --minutes 1`, then `--resume`; `pip install "
                    "--no-deps x`.\n\n`--pooling mean` alone.\n\n```bash\n"
                    "mpiexec -n 2 python -m bench.speed --steps 3 --nonexistent\n```\n")
    uses = {(flag, command) for _, flag, command in flag_uses(page)}
    assert uses == {("--help", "train.py"),
                    ("--minutes", "train.py"), ("--resume", "train.py"), ("--pooling", None),
                    ("--steps", "bench.speed"), ("--nonexistent", "bench.speed")}, uses
    assert flag_problems(page) == ["page.md:6: bench.speed has no --nonexistent (its --help)"]


# ------------------------------------------------------------------------- the set-up commands


def test_the_readme_test_command_is_what_ci_runs():
    """README's second set-up command runs what .ci/run runs, in order (CI's --quiet aside)."""
    setup = fenced_blocks(README)[0]
    readme = [shlex.join(w) for w in command_parts(setup.source.splitlines()[3])]
    ci = [shlex.join([w for w in shlex.split(line, comments=True) if w != "--quiet"])
          .replace("python -m pip", "pip") for line in CI.read_text().splitlines()
          if re.match(r"(python -m pip|ruff|python -m pytest)", line)]
    assert readme[2:] == ci, f"README:\n{readme[2:]}\n.ci/run:\n{ci}"


# ------------------------------------------------------------------------- the layout


def test_every_file_the_layouts_name_exists():
    """README's brief layout names paths from the root; docs/layout.md's tree names files."""
    brief = next(b for b in fenced_blocks(README) if b.lang == "" and "nanobert/" in b.source)
    missing = [line.split()[0] for line in brief.source.splitlines()
               if not (ROOT / line.split()[0]).exists()]
    tree = next(b for b in fenced_blocks(ROOT / "docs" / "layout.md") if b.lang == "")
    files = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts}
    missing += sorted(set(re.findall(r"[\w.]+\.py\b", tree.source)) - files)
    assert not missing, f"the layouts name what is not there: {missing}"


# ------------------------------------------------------------------------- links


def heading_anchor(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces -> -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    """Every heading anchor of a page, GitHub's -1, -2 ... suffixes on repeats."""
    found, repeats, fence = set(), {}, False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            anchor = heading_anchor(line.lstrip("#"))
            found.add(f"{anchor}-{repeats[anchor]}" if anchor in repeats else anchor)
            repeats[anchor] = repeats.get(anchor, 0) + 1
    return found


def links(path):
    """[(line, target)] of every Markdown link and image outside code."""
    found, fence = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence:
            continue
        line = re.sub(r"`[^`]*`", "``", line)
        found += [(number, m) for m in re.findall(r"\]\(([^)\s]+)\)", line)]
    return found


def link_problems(page):
    problems = []
    for line, target in links(page):
        if re.match(r"[a-z]+:", target):
            continue                # http(s), mailto: not this test's
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{page.name}:{line}: {target}: no {resolved}")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            problems.append(f"{page.name}:{line}: {target}: {resolved.name} has no "
                            f"heading #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    problems = link_problems(page)
    assert not problems, "\n".join(problems)


def test_the_link_check_finds_a_missing_file_and_heading(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## Two words\n\n## Two words\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](a.md#two-words) [ok](a.md#two-words-1) [ok](#here) "
                    "[no](a.md#three) [no](b.md) `[code](c.md)` [web](https://x.org/y)\n# Here\n")
    assert link_problems(page) == ["page.md:1: a.md#three: a.md has no heading #three",
                                   f"page.md:1: b.md: no {tmp_path / 'b.md'}"]


def test_the_readme_links_every_docs_page():
    linked = {target.partition("#")[0] for _, target in links(README)}
    missing = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in linked]
    assert not missing, f"README links no {missing}"


def test_the_paper_map_links_each_idea_to_a_derivation_that_exists():
    links_to_backward = [t for _, t in links(ROOT / "docs" / "paper.md")
                         if t.startswith("backward.md#")]
    assert len(links_to_backward) >= 15, links_to_backward


# ------------------------------------------------------------------------- docs/backward.md


@pytest.mark.parametrize("op", OPS)
def test_every_op_pair_has_a_derivation_linked_to_ops_py(op):
    text = BACKWARD.read_text()
    for name in (f"{op}_forward", f"{op}_backward"):
        assert hasattr(ops, name), f"ops.py has no {name}: update docs/backward.md and OPS"
        assert f"[`{name}`](../nanobert/model/ops.py)" in text, \
            f"docs/backward.md has no section that links {name}"


def test_the_failure_names_the_line_of_the_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# t\n\n```python\nx = 1\n```\n\ntext\n\n<!-- illustrative -->\n```python\n"
                   "x = 3\n```\n\n```python\nassert x == 2, x\n```\n")
    with pytest.raises(pytest.fail.Exception, match=r"doc.md, the python block at line 15: "
                                                    r"AssertionError: 1"):
        run_blocks(doc)
    assert re.search("x = 1", python_blocks(doc)[0][1]) and len(python_blocks(doc)) == 2
