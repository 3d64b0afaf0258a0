"""The ESS alarm (issue 23): the normalised ESS of W is logged per mini-batch index; a run built to collapse (plain
REINFORCE, N = 8, lr 0.1: the ESS of W stays near 0.13 for two steps) warns once, and with --stop-on-low-ess stops
early with a checkpoint; a healthy run never warns."""

import math

import pytest
import torch

from vespo.cli import main
from vespo.losses.core import ratio_metrics
from vespo.train.alarms import EssAlarm
from vespo.train.logs import read_metrics
from vespo.train.resume import CHECKPOINT


@pytest.fixture(scope="module")
def tiny_model(warm_model):
    return str(warm_model.model)


def _argv(model, run_dir, lr, *extra):
    return [
        "train", "--model", model, "--dataset", "embedded", "--num-operands", "2", "--eval-size", "20",
        "--train-batch-size", "16", "--ppo-mini-batch-size", "2", "--rollout-n", "4", "--micro-batch-size", "8",
        "--max-response-length", "8", "--lr", str(lr), "--total-training-steps", "6", "--eval-every", "0",
        "--num-threads", "1", "--no-progress", "--no-tensorboard", "--method", "reinforce",
        "--ess-alarm", "0.2", "--ess-alarm-patience", "1", "--run-dir", str(run_dir), *extra,
    ]  # fmt: skip


def test_is_ess_is_the_kish_ess_of_w():
    log_w = torch.tensor([0.0, 0.0, math.log(2.0), -100.0])  # W = 1, 1, 2, ~0: (sum W)^2 / (n sum W^2) = 16 / 24
    adv = torch.ones(4, 3)[:, :1].expand(4, 3)
    ess = ratio_metrics(log_w, adv, torch.ones(4, 3))["is/ess"]
    assert float(ess) == pytest.approx(16 / 24, rel=1e-6)


def test_alarm_logic_counts_consecutive_steps_and_fires_once(capsys):
    alarm = EssAlarm(0.5, patience=2, stop=False)
    seq = [0.9, 0.1, 0.8, 0.1, 0.1, 0.1, 0.05]
    assert not any(alarm.update(i, {"is/ess/last_mini_batch": e}) for i, e in enumerate(seq))
    assert capsys.readouterr().err.count("ESS of the stalest mini-batch") == 1  # once, at the 2nd step in a row
    assert EssAlarm(0.5, 1, stop=True).update(0, {"is/ess": 0.1}) is True
    assert EssAlarm(0.0, 1, stop=True).update(0, {"is/ess": 0.0}) is False  # 0 disables it


def test_a_run_built_to_collapse_warns_and_can_stop(tiny_model, tmp_path, capfd):
    assert main(_argv(tiny_model, tmp_path / "warn", 0.1)) == 0
    rows = read_metrics(tmp_path / "warn")
    assert len(rows) == 6 and rows[0]["is/ess/last_mini_batch"] < 0.2  # one stale sequence carries all the weight
    assert rows[0]["is/ess/first_mini_batch"] == pytest.approx(1.0)  # mini-batch 0 is on-policy: W == 1
    assert capfd.readouterr().err.count("ESS of the stalest mini-batch") == 1
    assert main(_argv(tiny_model, tmp_path / "stop", 0.1, "--stop-on-low-ess")) == 0
    stopped = read_metrics(tmp_path / "stop")
    assert len(stopped) < 6 and (tmp_path / "stop" / CHECKPOINT).is_file()
    assert "stopping (--stop-on-low-ess" in capfd.readouterr().err


def test_a_healthy_run_never_warns(tiny_model, tmp_path, capfd):
    argv = _argv(tiny_model, tmp_path / "ok", 1e-4)
    argv[argv.index("--train-batch-size") + 1] = "2"  # N = 1: on-policy, ESS = 1
    assert main(argv) == 0
    assert "ESS of the stalest" not in capfd.readouterr().err
