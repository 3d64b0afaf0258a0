"""Thread defaults: one thread for the embedded model, the free cores otherwise, said once and recorded."""

import os

import torch


def test_default_threads_one_for_the_embedded_model_and_the_free_cores_otherwise(tmp_path, monkeypatch):
    import vespo.machine as machine
    from vespo.train.config import TrainConfig
    from vespo.train.host import default_num_threads

    assert default_num_threads(TrainConfig())[0] == 1
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 1000)  # a small model: at most SMALL_MODEL_THREADS
    monkeypatch.setattr(machine, "usable_cores", lambda: 16)
    cfg = TrainConfig(model=str(model))
    for load, want in ((0.2, 4), (13.6, 2), (40.0, 1)):  # 16 cores, 14 busy: 2 free
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        threads, why = default_num_threads(cfg)
        assert threads == want and f"load {load:.1f}" in why, (load, threads, why)
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0, 4.0, 4.0))
    monkeypatch.setattr(machine, "policy_bytes", lambda *a: 8 << 30)  # an 8 GB model: every free core, shared
    assert default_num_threads(cfg)[0] == 12
    assert default_num_threads(cfg.replace(mode="async", num_samplers=2))[0] == 4


def test_train_says_its_thread_count_once_after_the_input_checks_and_records_it(tmp_path, capsys, monkeypatch):
    import vespo.train.setup
    from vespo.cli import main
    from vespo.train.config_io import load_yaml

    seen = []

    def stop_at_the_model(cfg, **kw):  # the first compute: record the thread count the run got, then stop
        seen.append(torch.get_num_threads())
        raise KeyboardInterrupt

    monkeypatch.setattr(vespo.train.setup, "embedded_policy_path", stop_at_the_model)
    threads = torch.get_num_threads()
    try:
        assert main(["train", "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 130
        err = capsys.readouterr().err.splitlines()
        assert seen == [1] and [line for line in err if "torch thread" in line] == [
            "vespo train: 1 torch thread (the embedded model runs fastest on one); --num-threads N to change"
        ]
        assert load_yaml(tmp_path / "run" / "config.yaml")["num_threads"] == 1  # what the run used
        assert main(["train", "--run-dir", str(tmp_path / "run2"), "--no-progress", "--num-threads", "2"]) == 130
        assert seen == [1, 2] and "torch thread" not in capsys.readouterr().err  # the user's choice: not announced
        assert main(["train", "--run-dir", str(tmp_path / "run3"), "--no-progress", "--reward-fn", "nope:fn"]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1  # a bad input stays one line
    finally:
        torch.set_num_threads(threads)
