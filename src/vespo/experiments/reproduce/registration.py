"""Registration: what git says about when a plan and its results were committed. A family is confirmatory only when
its plan's commit strictly precedes the first commit holding its results (`classify`); the report reads every design
from the plan file as git holds it at the commit that added it, never from this code."""

from __future__ import annotations

import csv
import io
import subprocess
from pathlib import Path

from vespo.experiments.reproduce.designs import PLANS, parse_design, read_text
from vespo.experiments.reproduce.plan import PLAN_HEAD, comparison_cells, section_names


def _git(root: Path, *args: str) -> str | None:
    """stdout of `git -C root args`, None when git fails (no repository, unknown path)."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None


def git_root(path: Path) -> Path | None:
    """The top of the git work tree that holds `path`, None outside git."""
    top = _git(path if path.is_dir() else path.parent, "rev-parse", "--show-toplevel")
    return Path(top.strip()) if top else None


def history(root: Path, rel: str) -> list[str]:
    """Commits that changed `rel`, oldest first (following no renames)."""
    text = _git(root, "log", "--reverse", "--format=%H", "--", rel)
    return text.split() if text else []


def show(root: Path, commit: str, rel: str) -> str | None:
    """`rel` as `commit` holds it, None where it does not."""
    return _git(root, "show", f"{commit}:{rel}")


def classify(plan_commit: str | None, results_commit: str | None, precedes: bool) -> tuple[str, str]:
    """The registration rule: confirmatory only when the plan's commit strictly precedes the first commit holding the
    family's results (or the results are not committed yet); a plan committed with or after its results, or not at
    all, makes the family exploratory."""
    if plan_commit is None:
        return "exploratory", "no commit holds its plan"
    if results_commit is None:
        return "confirmatory", f"plan {plan_commit[:7]}; results not committed yet"
    if plan_commit == results_commit:
        return "exploratory", f"plan added in the same commit as its results ({plan_commit[:7]})"
    if not precedes:
        return "exploratory", f"plan {plan_commit[:7]} does not precede its results {results_commit[:7]}"
    return "confirmatory", f"plan {plan_commit[:7]} precedes its results {results_commit[:7]}"


def _precedes(root: Path, a: str, b: str) -> bool:
    return a != b and _git(root, "merge-base", "--is-ancestor", a, b) is not None


def _cells_in(text: str | None) -> set[tuple[str, int]]:
    if not text:
        return set()
    try:
        return {(r["variant"], int(r["N"])) for r in csv.DictReader(io.StringIO(text))}
    except (KeyError, ValueError, TypeError):
        return set()


def _first_results(root: Path, rel: str, members: list[dict]) -> str | None:
    """The first commit whose `rel` holds every cell of some member comparison."""
    for commit in history(root, rel):
        cells = _cells_in(show(root, commit, rel))
        if any(set(comparison_cells(c)) <= cells for c in members):
            return commit
    return None


def registration(out: Path, fams: dict[str, list[dict]], results_rel: str, plan_commit_of) -> dict:
    """Per family: its plan's commit (`plan_commit_of(root, members)`), the first commit of `results_rel` holding its
    results, and its class (`classify`). Outside git every family is exploratory."""
    root = git_root(out)
    out_rel = None if root is None else Path(out).resolve().relative_to(root.resolve()).as_posix()
    reg = {}
    for family, members in fams.items():
        if root is None:
            reg[family] = {"plan_commit": None, "results_commit": None, "class": "exploratory",
                           "why": "not in a git repository"}  # fmt: skip
            continue
        plan = plan_commit_of(root, out_rel, members)
        results = _first_results(root, f"{out_rel}/{results_rel}", members)
        cls, why = classify(plan, results, results is not None and plan is not None and _precedes(root, plan, results))
        reg[family] = {"plan_commit": plan, "results_commit": results, "class": cls, "why": why}
    return reg


def table_plan_commit(root: Path, out_rel: str, members: list[dict]) -> str | None:
    """The commit by which plan.md named every member of a table family (the last member's first appearance); None
    when one never appears."""
    commits = history(root, f"{out_rel}/plan.md")
    first = {}
    for i, commit in enumerate(commits):
        text = show(root, commit, f"{out_rel}/plan.md") or ""
        for c in members:
            if c["name"] not in first and _names_in(text, c["name"]):
                first[c["name"]] = i
    if len(first) < len(members):
        return None
    return commits[max(first.values())]


def _names_in(text: str, name: str) -> bool:
    return any(name in section_names(s) for s in text.split(PLAN_HEAD)[1:])


def design_plan_commit(name: str):
    """The plan-commit reader of design `name` (`registration`'s `plan_commit_of`): the commit that added its plan."""

    def plan_commit(root: Path, out_rel: str, members: list[dict]) -> str | None:
        rel = f"{out_rel}/{PLANS}/{name}.md"
        text = _git(root, "log", "--reverse", "--diff-filter=A", "--format=%H", "--", rel)
        return text.split()[0] if text and text.split() else None

    return plan_commit


def committed_designs(out: Path) -> list[dict]:
    """The designs of plans/*.md, each as git holds it at the commit that added it (the working tree's when it is not
    committed: then its families are exploratory); `changed` when the file differs from that commit's."""
    found = []
    root = git_root(out)
    for path in sorted((out / PLANS).glob("*.md")) if (out / PLANS).is_dir() else []:
        text = read_text(path)
        d = parse_design(text, str(path))
        d["changed"] = False
        if root is not None:
            rel = path.resolve().relative_to(root.resolve()).as_posix()
            added = _git(root, "log", "--reverse", "--diff-filter=A", "--format=%H", "--", rel)
            if added and added.split():
                committed = show(root, added.split()[0], rel)
                if committed is not None and committed != text:
                    d = parse_design(committed, f"{rel} at {added.split()[0][:7]}") | {"changed": True}
        found.append(d)
    return found


def plan_committed(out: Path, name: str) -> str:
    """The commit that added plans/<name>.md, once the file is committed and unchanged; else a ValueError saying to
    commit it alone first."""
    path = out / PLANS / f"{name}.md"
    root = git_root(out)
    if not path.is_file() or root is None:
        raise ValueError(f"{path}: no committed plan; write it with --design {name} --plan-only and commit it alone")
    rel = path.resolve().relative_to(root.resolve()).as_posix()
    added = _git(root, "log", "--reverse", "--diff-filter=A", "--format=%H", "--", rel)
    if not added or not added.split():
        raise ValueError(f"{path} is not committed: commit it alone (git add {rel} && git commit) before its cells run")
    if show(root, added.split()[0], rel) != read_text(path):
        raise ValueError(f"{path} differs from the commit that added it ({added.split()[0][:7]}): a plan is written "
                         "once; a new design gets a name of its own")  # fmt: skip
    return added.split()[0]
