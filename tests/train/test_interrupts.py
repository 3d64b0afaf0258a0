"""One Ctrl-C stops every command, its worker processes included, in one line (exit 130)."""

import json
import signal
import time

import pytest
from _commands import Running, alive, descendants


@pytest.mark.slow
def test_one_sigint_stops_a_sweep_and_its_cells(tmp_path):
    """SIGINT to the sweep process alone: no new cell starts, the running one is stopped (it is the sweep's job to
    pass the signal on), one line says what was kept, exit 130, no traceback; rerunning continues."""
    out = tmp_path / "sweep"
    argv = ["sweep", "--out-dir", str(out), "--cache-dir", str(tmp_path / "cache"), "--methods", "vespo", "grpo",
            "--num-mini-batches", "1", "--seeds", "0", "1", "--optimizer-steps", "400", "--eval-size", "8",
            "--eval-n", "1", "--jobs", "1", "--extra", "sft_steps", "5", "sft_batch_size", "4", "tensorboard",
            "False"]  # fmt: skip
    run = Running(*argv)
    run.wait_for(lambda: len(list((out / "cells").rglob("*.log"))) == 1 and descendants(run.proc.pid))
    time.sleep(2)
    workers = descendants(run.proc.pid)
    code = run.interrupt()
    lines = [line for line in run.err.splitlines() if "vespo sweep" in line and "interrupted" in line]
    assert code == 130 and "Traceback" not in run.err, run.err[-3000:]
    assert len(lines) == 1 and "0 of 4 cells finished" in lines[0] and "same command continues" in lines[0], lines
    time.sleep(1)
    assert not [p for p in workers if alive(p)], "a cell process outlived the sweep"
    assert len(list((out / "cells").rglob("*.log"))) == 1, "no cell may start after the interrupt"


@pytest.mark.slow
def test_sigterm_stops_a_background_sweeps_cells_as_ctrl_c_does(tmp_path):
    """A sweep started as `cmd &` (SIGINT ignored, and so in its cells) and stopped by SIGTERM: its running cell stops
    as on Ctrl-C (its log says so, its checkpoint is kept), not killed after a wait, and nothing below the sweep (a
    cell's forkserver included) outlives it."""
    out = tmp_path / "sweep"
    argv = ["sweep", "--out-dir", str(out), "--cache-dir", str(tmp_path / "cache"), "--methods", "vespo",
            "--num-mini-batches", "1", "--seeds", "0", "1", "--optimizer-steps", "4000", "--eval-size", "8",
            "--eval-n", "1", "--jobs", "1", "--extra", "sft_steps", "5", "sft_batch_size", "4", "tensorboard",
            "False", "save_every", "1"]  # fmt: skip
    run = Running(*argv, background=True)
    logs = lambda: list((out / "cells").rglob("*.log"))  # noqa: E731
    training = lambda: any(p.stat().st_size for p in (out / "cells").rglob("metrics.jsonl"))  # noqa: E731
    run.wait_for(lambda: (out / "cells").is_dir() and training())
    workers = descendants(run.proc.pid)
    code = run.interrupt(signal.SIGTERM)
    assert code == 130 and "Traceback" not in run.err, run.err[-3000:]
    stopped = [log for log in logs() if "vespo train: interrupted" in log.read_text()]
    assert len(stopped) == 1, [log.read_text()[-1000:] for log in logs()]
    time.sleep(1)
    assert not [p for p in workers if alive(p)], "a cell process outlived the sweep"


@pytest.mark.slow
def test_one_sigint_stops_a_lab_grid_and_its_worker_processes(tmp_path):
    out = tmp_path / "lab"
    argv = ["lab", "--preset", "v1", "--out-dir", str(out), "--methods", "vespo", "grpo", "--length", "4096",
            "--num-mini-batches", "1", "--lr-scale", "1", "--seeds", "0", "1", "2", "--optimizer-steps", "4000",
            "--jobs", "2"]  # fmt: skip
    run = Running(*argv)
    run.wait_for(lambda: len(descendants(run.proc.pid)) >= 2)
    time.sleep(2)
    workers = descendants(run.proc.pid)
    code = run.interrupt()
    assert code == 130 and "Traceback" not in run.err, run.err[-3000:]
    assert run.err.strip().splitlines()[-1].startswith("vespo lab: interrupted; 0 of 6 cells finished"), run.err
    time.sleep(1)
    assert not [p for p in workers if alive(p)], "a lab worker outlived the grid"


@pytest.mark.slow
def test_one_sigint_stops_an_evaluation_in_one_line(random_model, tmp_path):
    data = tmp_path / "many.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i % 10}+{i % 7}=", "answer": str(i % 10 + i % 7)}) + "\n"
                            for i in range(4000)))  # fmt: skip
    out = tmp_path / "eval"
    run = Running("eval", "--model", str(random_model), "--benchmarks", str(data), "--k", "2", "--max-new-tokens",
                   "12", "--device", "cpu", "--out", str(out))  # fmt: skip
    run.wait_for(lambda: "many" in run.err)  # generating (the benchmark's progress bar)
    time.sleep(1)
    code = run.interrupt()
    last = run.err.strip().splitlines()[-1]
    assert code == 130 and "Traceback" not in run.err, run.err[-3000:]
    assert last == "vespo eval: interrupted; nothing was written to --out", last
    assert not out.exists()  # a claim that wrote nothing leaves nothing
