"""Run a veRL CPU job (tests/_verl_*_job.py) as 1 and 2 data-parallel ranks on gloo: the launcher the veRL worker
tests share (the test side, `run_world_sizes`) and the job side's `main` (`run_ranks`). veRL's CPU platform is
process-wide, so each world size is its own set of subprocesses; both sizes run side by side."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world_sizes(job: str, tmp, world_sizes: tuple[int, ...], timeout: float) -> dict[int, list[dict]]:
    """{world_size: [per-rank results]} of tests/`job` on a tiny random Llama; a failed rank's log tail on failure."""
    from vespo.embedded.task import build_tiny_model, build_tokenizer

    model_dir = tmp / "model"
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    src = os.path.join(HERE, "..", "..", "src")
    base_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    procs = []
    for world in world_sizes:
        port = str(_free_port())
        for rank in range(world):
            env = {**base_env, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_PORT": port}
            log = open(tmp / f"w{world}_r{rank}.log", "w")
            cmd = [sys.executable, os.path.join(HERE, job), str(model_dir), str(tmp / f"w{world}.json")]
            procs.append((world, rank, log, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)))
    failed = []
    for world, rank, log, proc in procs:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "timeout"
        log.close()
        if code != 0:
            failed.append(f"world {world} rank {rank} exited {code}:\n" + open(log.name).read()[-4000:])
    assert not failed, "\n\n".join(failed)
    return {world: json.load(open(tmp / f"w{world}.json")) for world in world_sizes}


def run_ranks(run_scenario, scenarios, model_dir: str, out_path: str, setup=()) -> None:
    """One rank of a job: veRL on CPU (plus `setup` calls), every scenario in one gloo group, rank 0 writes all
    ranks' results as JSON."""
    import torch
    import torch.distributed as dist
    from _verl_cpu import use_cpu

    torch.set_num_threads(1)  # one process per rank on a small shared CPU; more threads only contend
    use_cpu()
    for step in setup:
        step()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {name: run_scenario(model_dir, name, *spec, rank, world) for name, *spec in scenarios}
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f, indent=1, default=str)
    dist.destroy_process_group()
