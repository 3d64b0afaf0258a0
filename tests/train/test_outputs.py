"""vespo.outputs, the one place that decides what vespo may write: locks and temporary files never follow a link,
never block on a FIFO, never write through a second hard link; `clear` respects the locks of nested output dirs;
the writer leaves the old or the new file after a failure; a lock removed in the claim's window is not trusted."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
from pathlib import Path

import pytest

from vespo import outputs
from vespo.outputs import LOCK, MARKER, OutputError, atomic_dir, claim, open_append, read_regular, write_atomic

OUTSIDE = b"precious data outside the run dir\n" * 80  # ~2.6 KB, like the reproducer's


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "outside.txt"
    path.write_bytes(OUTSIDE)
    return path


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path, outside):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).symlink_to(outside)  # a directory that otherwise counts as empty
    with pytest.raises(OutputError, match="symbolic link"):
        claim(run, "train", ["metrics.jsonl"], label="run_dir")
    assert outside.read_bytes() == OUTSIDE
    assert not (run / MARKER).exists()


def test_a_hard_linked_lock_is_refused_and_its_other_name_untouched(tmp_path, outside):
    run = tmp_path / "run"
    run.mkdir()
    os.link(outside, run / LOCK)
    with pytest.raises(OutputError, match="hard links"):
        claim(run, "train", ["metrics.jsonl"], label="run_dir")
    assert outside.read_bytes() == OUTSIDE


def test_a_symlinked_marker_is_not_replaced(tmp_path, outside):
    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).symlink_to(outside)
    with pytest.raises(OutputError, match="not a marker vespo wrote"):
        claim(run, "train", ["metrics.jsonl"], label="run_dir")
    assert (run / MARKER).is_symlink() and outside.read_bytes() == OUTSIDE


def _returns_within(fn, seconds=120.0):
    """Run `fn` in a thread; what it raised, or "hung" if it is still blocked after `seconds` (a deadlock guard
    for a call that must not block at all, not a speed limit)."""
    box = []

    def target():
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            box.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    return "hung" if thread.is_alive() else box[0]


@pytest.mark.parametrize("name", [MARKER, LOCK])
def test_a_fifo_in_place_of_marker_or_lock_is_refused_without_blocking(tmp_path, name):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / name)
    result = _returns_within(lambda: claim(run, "train", ["metrics.jsonl"], label="run_dir"))
    assert isinstance(result, OutputError), result


def test_open_regular_refuses_links_fifos_and_directories(tmp_path, outside):
    (tmp_path / "link").symlink_to(outside)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name in ("link", "fifo", "dir"):
        result = _returns_within(lambda name=name: read_regular(tmp_path / name))
        assert isinstance(result, OSError), (name, result)
    with pytest.raises(OSError):
        open_append(tmp_path / "link")
    assert outside.read_bytes() == OUTSIDE
    with open_append(tmp_path / "log.jsonl") as f:
        f.write("a\n")
    with open_append(tmp_path / "log.jsonl") as f:
        f.write("b\n")
    assert read_regular(tmp_path / "log.jsonl") == b"a\nb\n"


def test_write_atomic_never_writes_through_a_planted_temporary_name(tmp_path, outside):
    target = tmp_path / "config.yaml"
    for pid in (os.getpid(), os.getpid() + 1):  # the names the old writer predicted
        (tmp_path / f".config.yaml.{pid}.tmp").symlink_to(outside)
    (tmp_path / "config.yaml.tmp").symlink_to(outside)
    write_atomic(target, "a: 1\n")
    write_atomic(target, b"a: 2\n")
    write_atomic(target, lambda f: f.write(b"a: 3\n"))
    assert target.read_text() == "a: 3\n" and not target.is_symlink()
    assert outside.read_bytes() == OUTSIDE
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)


def test_write_atomic_replaces_a_link_at_the_target_not_the_file_it_points_to(tmp_path, outside):
    (tmp_path / "summary.json").symlink_to(outside)
    write_atomic(tmp_path / "summary.json", "{}")
    assert outside.read_bytes() == OUTSIDE and (tmp_path / "summary.json").read_text() == "{}"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "summary.json"
    write_atomic(target, '{"old": 1}')

    def torn(f):
        f.write(b'{"ne')
        raise KeyboardInterrupt  # a Ctrl-C mid-write

    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, torn)
    assert json.loads(target.read_text()) == {"old": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_atomic_dir_publishes_whole_or_not_at_all_and_cleans_a_killed_build(tmp_path):
    out = tmp_path / "model"
    with pytest.raises(RuntimeError), atomic_dir(out) as tmp:
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("killed between config.json and the weights")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    killed = tmp_path / ".model.abc123.tmp"  # what a SIGKILL leaves (no Python cleanup runs)
    killed.mkdir()
    (killed / outputs._ATOMIC_TAG).touch()
    (killed / "config.json").write_text("{}")
    foreign = tmp_path / ".model.user.tmp"  # a user's directory of the same shape is not vespo's: kept
    foreign.mkdir()
    with atomic_dir(out) as tmp:
        (tmp / "config.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(b"w")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert not killed.exists() and foreign.is_dir()
    with atomic_dir(out, replace=True) as tmp:
        (tmp / "config.json").write_text('{"v": 2}')
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.user.tmp", "model"]


def test_clear_refuses_to_delete_a_nested_output_dir_another_process_holds(tmp_path):
    sweep = claim(tmp_path / "sweep", "sweep", ["cells", "results.csv"], label="out_dir")
    (sweep.path / "results.csv").write_text("x\n")
    cell = claim(sweep.path / "cells" / "vespo-n64-s1", "train", ["metrics.jsonl"], label="run_dir")  # a live train
    (cell.path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(OutputError, match="in use by another vespo process"):
        sweep.clear()
    assert (cell.path / "metrics.jsonl").is_file() and (sweep.path / "results.csv").is_file()
    cell.release()
    assert sorted(sweep.clear()) == ["cells", "results.csv"]
    assert not (sweep.path / "cells").exists()
    sweep.release()


def test_a_lock_file_removed_in_the_claims_window_is_not_trusted(tmp_path, monkeypatch):
    """Process A releases (unlinks LOCK) between our open and our flock: the flock on the orphaned file would let a
    third process lock a fresh LOCK at the same time. The claim must end up holding the file LOCK names."""
    run = tmp_path / "run"
    run.mkdir()
    real_flock, calls = fcntl.flock, []

    def flock(fd, op):
        if not calls:  # the first attempt: the file is removed under us, as `release` does
            os.unlink(run / LOCK)
        calls.append(op)
        return real_flock(fd, op)

    monkeypatch.setattr(outputs.fcntl, "flock", flock)
    owned = claim(run, "train", ["metrics.jsonl"], label="run_dir")
    assert len(calls) == 2
    assert os.fstat(owned._lock.fileno()).st_ino == os.lstat(run / LOCK).st_ino
    assert read_regular(run / LOCK) == f"{os.getpid()}\n".encode()
    owned.release()


def test_a_second_claim_is_refused_with_the_holders_pid(tmp_path):
    first = claim(tmp_path / "run", "train", ["metrics.jsonl"], label="run_dir")
    with pytest.raises(OutputError, match=f"pid {os.getpid()}"):
        claim(tmp_path / "run", "train", ["metrics.jsonl"], label="run_dir")
    first.release()
    assert not Path(tmp_path / "run").exists()  # a claim that wrote nothing leaves nothing


def test_the_samplers_fork_server_does_not_import_from_the_working_directory(tmp_path):
    """`vespo train --async` started in a directory holding `regex.py` must not run it: the fork server's
    `python -c` interpreter would put '' first on its path (breakage 4 of round 5)."""
    import subprocess
    import sys

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    planted = tmp_path / "planted.log"
    (cwd / "vespo_planted_module.py").write_text(f"open({str(planted)!r}, 'a').write('imported\\n')\n")
    script = tmp_path / "start.py"  # outside cwd: its own directory is the parent's sys.path[0], as for `vespo`
    script.write_text(
        "import os\n"
        "from vespo.train import forkserver\n"
        "if __name__ == '__main__':\n"
        "    forkserver.PRELOAD = ('vespo_planted_module',)\n"
        "    ctx = forkserver.sampler_context()\n"
        "    p = ctx.Process(target=os.getpid)  # the preload has run once a process is forked from the server\n"
        "    p.start(); p.join(); assert p.exitcode == 0, p.exitcode\n"
        "    assert os.getcwd() == os.environ['EXPECT_CWD']\n"
    )
    env = os.environ | {"EXPECT_CWD": str(cwd)}
    env.pop("PYTHONSAFEPATH", None)
    subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, check=True, timeout=300)
    assert not planted.exists()


def test_sweep_overwrite_refuses_while_a_cell_is_held_and_a_fifo_results_csv_does_not_hang(tmp_path):
    from vespo.experiments.grid import claim_grid_dir
    from vespo.experiments.sweep import SWEEP_OUTPUTS

    out = tmp_path / "sweep"
    first = claim_grid_dir("sweep", out, SWEEP_OUTPUTS, overwrite=False, columns={"variant"})
    cell = claim(out / "cells" / "vespo-N64-s1", "train", ["metrics.jsonl"], label="run_dir")  # a live `vespo train`
    (cell.path / "metrics.jsonl").write_text("{}\n")
    first.release()
    with pytest.raises(OutputError, match="in use by another vespo process"):
        claim_grid_dir("sweep", out, SWEEP_OUTPUTS, overwrite=True, columns={"variant"})
    assert (cell.path / "metrics.jsonl").is_file()
    cell.release()
    claim_grid_dir("sweep", out, SWEEP_OUTPUTS, overwrite=True, columns={"variant"}).release()
    assert not (out / "cells").exists()

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.mkfifo(foreign / "results.csv")  # the legacy check reads results.csv: it must not block on a FIFO
    result = _returns_within(lambda: claim_grid_dir("sweep", foreign, SWEEP_OUTPUTS, overwrite=False, columns={"x"}))
    assert isinstance(result, OutputError) and "not empty" in str(result)


def test_atomic_dir_leaves_a_concurrent_build_alone_and_creates_the_parent(tmp_path):
    import fcntl as _fcntl

    out = tmp_path / "cache" / "embedded-abc"  # the cache directory does not exist yet
    with atomic_dir(out) as tmp:
        (tmp / "config.json").write_text("{}")
    assert (out / "config.json").is_file()
    running, killed = (tmp_path / "cache" / f".embedded-abc.{name}.tmp" for name in ("live", "dead"))
    for d in (running, killed):
        d.mkdir()
        (d / outputs._ATOMIC_TAG).touch()
    fd = os.open(running / outputs._ATOMIC_TAG, os.O_RDWR)
    _fcntl.flock(fd, _fcntl.LOCK_EX)  # another process building the same directory right now
    try:
        with atomic_dir(out, replace=True) as tmp:
            (tmp / "config.json").write_text('{"v": 2}')
    finally:
        os.close(fd)
    assert running.is_dir() and not killed.exists() and (out / "config.json").read_text() == '{"v": 2}'


def test_eval_samples_file_is_never_truncated_through_a_hard_link(tmp_path, outside):
    from vespo.evaluation import _open_samples

    os.link(outside, tmp_path / "samples.jsonl")
    with pytest.raises(OutputError, match="hard links"):
        _open_samples(tmp_path / "samples.jsonl")
    assert outside.read_bytes() == OUTSIDE
    (tmp_path / "samples.jsonl").unlink()
    (tmp_path / "samples.jsonl").write_text("old\n")
    with _open_samples(tmp_path / "samples.jsonl") as f:
        f.write("new\n")
    assert (tmp_path / "samples.jsonl").read_text() == "new\n"


def test_a_claim_sweeps_only_the_atomic_writers_temporaries_of_the_dirs_own_entries(tmp_path):
    """Issue 50: a kill during `write_atomic` leaves `.<name>.<8 random>.tmp`; the next claim of the dir deletes
    those of its manifest's names and inside its manifest's directories, and nothing else: not a name outside the
    manifest, not another pattern, not an `atomic_dir` build (its own sweep's), not inside a nested output dir."""
    run = tmp_path / "run"
    with claim(run, "x", ["a.txt", "sub"], label="out"):
        write_atomic(run / "a.txt", "mine")
    (run / "sub" / "nested").mkdir(parents=True)
    (run / "sub" / "nested" / MARKER).write_text("{}")
    (run / "sub" / ".build.abcdefgh.tmp").mkdir()
    gone = [run / ".a.txt.k2_9zq0a.tmp", run / f".{MARKER}.abcdefgh.tmp", run / "sub" / ".w.pt.abcdefgh.tmp"]
    kept = [run / ".b.txt.abcdefgh.tmp", run / ".a.txt.abc.tmp", run / ".a.txt.ABCDEFGH.tmp", run / "a.txt.tmp",
            run / "sub" / "nested" / ".f.abcdefgh.tmp", run / "sub" / ".build.abcdefgh.tmp" / "part"]  # fmt: skip
    for path in gone + kept:
        path.write_text("x")
    with claim(run, "x", ["a.txt", "sub"], label="out"):
        assert not any(p.exists() for p in gone)
        assert all(p.read_text() == "x" for p in kept)


def test_read_regular_with_a_cap_refuses_a_larger_file(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_regular(path, cap=10) == b"x" * 10 and read_regular(path, 4) == b"xxxx"
    path.write_bytes(b"x" * 11)
    with pytest.raises(OSError, match="larger than") as info:
        read_regular(path, cap=10)
    assert info.value.errno == errno.EFBIG and info.value.filename == str(path)
