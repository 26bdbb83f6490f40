"""What a new user's first week tripped over (issue 64, item 5): ``--quick`` shown in
``reshard-bench --help``'s examples but not among its options, the paper suite's
missing case 8 explained only in the source, a script beside a clone named
``reshard/`` failing with a bare ImportError the guide did not mention."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from reshard.microbench import cli
from reshard.microbench.suites.paper import n_to_m_cases

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _help(capsys) -> str:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    return " ".join(capsys.readouterr().out.split())  # as one line: help wraps


def test_every_flag_of_the_help_examples_is_an_option(capsys):
    text = _help(capsys)
    examples = text.split("Examples:")[1].split("options:")[0]
    options = text.split("options:")[1]
    used = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", examples))
    assert "--quick" in used
    missing = [f for f in sorted(used) if f"{f} " not in options]
    assert not missing, f"examples use {missing}, which --help does not list"
    assert "search suite (--suite search only" in options


def test_search_flags_outside_the_search_suite_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--quick"])
    assert e.value.code == 2
    assert "--quick: these apply to --suite search only" in capsys.readouterr().err


def test_the_search_suite_takes_its_flags(monkeypatch):
    from reshard.microbench import search_bench

    seen = []
    monkeypatch.setattr(search_bench, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["--suite", "search", "--quick", "--schedule", "eager-1f1b"]) == 0
    assert seen == [["--quick", "--schedule", "eager-1f1b"]]


def test_the_missing_case_8_is_explained_where_the_suite_is_listed(capsys):
    names = [c.name for c in n_to_m_cases()]
    assert "8" not in names and {"7", "9"} <= set(names)
    assert "the published case 8 repeats case 7, so it is left out" in _help(capsys)
    bench = " ".join((ROOT / "docs" / "benchmark.md").read_text(encoding="utf-8").split())
    assert "published case 8 repeats case 7, so it is left out" in bench


@pytest.mark.timeout(120)
def test_the_guide_says_what_a_clone_named_reshard_beside_a_script_does(tmp_path):
    """The guide's set-up quotes the error a script beside a folder named ``reshard/``
    (the clone) gets, and the fix: run it elsewhere. Both as the guide says."""
    guide = " ".join((ROOT / "docs" / "guide.md").read_text(encoding="utf-8").split())
    quoted = re.search(r"fails with `(ImportError: [^`]*)`", guide)
    assert quoted, "the guide's set-up lost its line on a clone named reshard/"
    (tmp_path / "reshard").symlink_to(ROOT, target_is_directory=True)  # the clone
    script = "from reshard import Layout\nprint('imported', Layout.__name__)\n"
    (tmp_path / "beside.py").write_text(script)
    out = subprocess.run([sys.executable, "beside.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=100, check=False)
    assert out.returncode != 0 and quoted.group(1) in out.stderr, out.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "script.py").write_text(script)
    ok = subprocess.run([sys.executable, "script.py"], cwd=elsewhere, capture_output=True,
                        text=True, timeout=100, check=False)
    assert ok.returncode == 0 and "imported Layout" in ok.stdout, ok.stderr[-2000:]


def test_the_readme_fits_a_page_keeps_the_two_commands_and_maps_the_docs():
    """README.md: at most 200 lines; its test command is exactly what CI runs
    (.ci/run); its first command installs and runs reshard-bench; its map names every
    page of docs/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    commands = re.findall(r"```bash\n(python3 -m pip install [^\n]*)\n```", readme)
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.startswith("python3 -m pip install")]
    assert len(commands) == 2 and commands[1] == ci[0]
    assert commands[0].endswith("&& reshard-bench")
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    unmapped = [p for p in pages if f"(docs/{p})" not in readme and p != "index.md"]
    assert not unmapped, f"README's map of docs/ lacks {unmapped}"


def test_run_modes_duration_is_one_figure_with_its_load_everywhere():
    """README, guide and summary state run mode's duration alike: its CPU time, and the
    wall time with the load it was measured at (not a bare 'under 2 minutes')."""
    for page in ("README.md", "docs/guide.md", "docs/summary.md"):
        text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        assert "110 s of CPU" in text, page
        assert "177-243 s wall" in text or "177, 236 and 243 s" in text, page
        assert "load average 6-16 on 2 cores" in text, page
        assert "under 2 minutes" not in text and "about 70 s here" not in text, page
