"""vespo's losses through veRL's own worker path on CPU, 1 and 2 data-parallel ranks (torch.distributed on gloo).

Hydra `ppo_trainer` config with the documented override lines -> `ActorRolloutRefWorker` -> FSDP2 engine ->
`ppo_loss` -> vespo's registered policy loss -> `agg_loss` with veRL's global batch info. Each world size is one
set of subprocesses (tests/integrations/_verl_worker_job.py; the CPU platform is process-wide) that runs every
scenario; the
assertions here read what they recorded.
"""

import os
import sys

import pytest
from _optional import require

require("verl")
require("peft")  # imported by veRL's FSDP engine
require("uvicorn")  # imported by veRL's worker module (rollout server utilities)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _verl_ranks import run_world_sizes  # noqa: E402
from _verl_worker_job import MICRO, SCENARIOS, B  # noqa: E402

pytestmark = pytest.mark.slow  # one module fixture runs veRL's FSDP worker in 1 and 2 processes (~30 s)
WORLD_SIZES = (1, 2)
TIMEOUT = 900  # seconds, for both world sizes running side by side


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{world_size: [per-rank results]}: both world sizes at once, every scenario in one process group each."""
    return run_world_sizes("_verl_worker_job.py", tmp_path_factory.mktemp("verl_workers"), WORLD_SIZES, TIMEOUT)


CASES = [(world, s[0]) for world in WORLD_SIZES for s in SCENARIOS]
SPEC = {name: (loss_mode, hparams, agg, level) for name, loss_mode, hparams, agg, level in SCENARIOS}


@pytest.mark.parametrize(("world", "name"), CASES)
def test_registered_loss_runs_on_every_micro_batch_with_the_configured_settings(runs, world, name):
    """Each rank's loss calls cover its shard in micro-batches, with the hparams, IS level and veRL's global counts."""
    loss_mode, hparams, agg, level = SPEC[name]
    ranks = [r[name] for r in runs[world]]
    total_tokens = sum(c["tokens"] for r in ranks for c in r["calls"])
    for r in ranks:
        assert [c["rows"] for c in r["calls"]] == [MICRO] * (B // (MICRO * world))
        for call in r["calls"]:
            assert call["hparams"] == hparams
            assert call["rollout_is"] == level and call["is_weights"] == (level is not None)
            assert call["loss_agg_mode"] == agg
            assert call["global_batch_info"] == {
                "dp_size": world,
                "batch_num_tokens": total_tokens,
                "global_batch_size": B,
            }
        assert r["log_prob_err"] < 1e-5  # veRL's compute_log_prob (packed, no padding) equals the HF forward


@pytest.mark.parametrize(("world", "name"), CASES)
def test_update_equals_reference_on_the_full_batch(runs, world, name):
    """SGD(lr=1) update through veRL == minus the gradient of vespo.compute_policy_loss on the whole batch."""
    r = runs[world][0][name]
    assert r["params_compared"] == 29  # every parameter tensor of the tiny Llama
    assert r["grad_err"] < 1e-6, (r["grad_err"], r["grad_scale"])
    assert r["grad_scale"] > 1e-2  # a real gradient, not zeros on both sides
    (loss,) = r["metrics"]["loss"]  # one mini-batch: veRL's sum over micro-batches, averaged over ranks
    (pg_loss,) = r["metrics"]["actor/pg_loss"]
    assert loss == pytest.approx(r["ref_loss"], abs=1e-6)
    assert pg_loss == pytest.approx(r["ref_loss"], abs=1e-6)
    # what the scenario configures (hparams, rollout correction) changes the loss, so the match is not vacuous
    assert abs(r["ref_loss"] - r["ablated_loss"]) > 1e-3


@pytest.mark.parametrize(("world", "name"), CASES)
def test_vespo_metrics_come_back_through_verl(runs, world, name):
    loss_mode, _, _, _ = SPEC[name]
    metrics = runs[world][0][name]["metrics"]
    expected = ["actor/ppo_kl", "actor/pg_clipfrac", "actor/weight/ess", "actor/is/log_w_mean", "actor/is/approx_kl"]
    if loss_mode == "vespo":
        expected += ["actor/vespo/Z", "actor/vespo/phi_sq_mean"]
    for key in expected:
        (value,) = metrics[key]
        assert value == value and abs(value) < 1e6, key  # finite
    if loss_mode == "vespo_gspo":
        assert metrics["actor/pg_clipfrac"][0] > 0  # the narrowed clip range is active on this batch
