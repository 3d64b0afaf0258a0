"""vespo's losses through veRL 0.9.1's V1 trainer (`trainer.use_v1`, its default), `separate_async` mode, on CPU.

1. A V1 training step, 1 and 2 data-parallel ranks (torch.distributed on gloo): veRL's
   `PPOTrainerSeparateAsync.step` with `parameter_sync_step` = 4 in decoupled mode drives a `DetachActorWorker`
   (FSDP2 engine) whose policy loss is vespo's, registered through the `verl.plugins` entry point; what V1 needs a
   cluster for (TransferQueue, the Ray worker group, rollout) is stood in for as tests/integrations/_verl_v1_job.py
   says. Each
   mini-batch's loss and the four SGD(lr=1) updates are replayed with `vespo.compute_policy_loss` under pi_old = the
   cycle's first weights.
2. examples/verl/v1_separate_async_megatron.sh composed against veRL's own V1 config, with what V1's separate_async
   trainer asserts before it starts.
"""

import math
import os
import subprocess
import sys

import pytest
from _optional import require

require("verl")
require("peft")  # imported by veRL's FSDP engine
require("transfer_queue")  # imported by veRL's V1 trainer modules (veRL's verl-core extra: TransferQueue)
require("cachetools")  # imported by veRL's rollout router, which the V1 trainer imports

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples", "verl")
sys.path.insert(0, HERE)
from _verl_ranks import run_world_sizes  # noqa: E402
from _verl_v1_job import MICRO, MINI, SCENARIOS, SEQS, SYNC_STEPS  # noqa: E402

WORLD_SIZES = (1, 2)
TIMEOUT = 900  # seconds, for both world sizes running side by side


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{world_size: [per-rank results]}: both world sizes at once, every scenario in one process group each."""
    return run_world_sizes("_verl_v1_job.py", tmp_path_factory.mktemp("verl_v1"), WORLD_SIZES, TIMEOUT)


CASES = [(world, s[0]) for world in WORLD_SIZES for s in SCENARIOS]
SPEC = {name: (loss_mode, hparams, agg, level) for name, loss_mode, hparams, agg, level in SCENARIOS}


@pytest.mark.slow
@pytest.mark.parametrize(("world", "name"), CASES)
def test_v1_step_calls_the_registered_loss_on_every_micro_batch_of_the_cycle(runs, world, name):
    """V1's step reaches vespo's loss for every micro-batch of all 4 mini-batches, with the configured hparams,
    decoupled mode, veRL's rollout-correction weights when configured, and V1's per-mini-batch global counts."""
    loss_mode, hparams, agg, level = SPEC[name]
    ranks = [r[name] for r in runs[world]]
    per_mini = MINI // (MICRO * world)  # micro-batches per rank per mini-batch
    for r in ranks:
        assert r["served"] == SEQS  # the replay buffer was drained, one mini-batch per local step
        assert [c["rows"] for c in r["calls"]] == [MICRO] * (SYNC_STEPS * per_mini)
        for call in r["calls"]:
            assert call["hparams"] == hparams and call["loss_agg_mode"] == agg
            assert call["rollout_is"] == level and call["is_weights"] == (level is not None)
            assert call["bypass_mode"] is False
            info = call["global_batch_info"]
            assert (info["dp_size"], info["global_batch_size"]) == (world, MINI)  # V1: ppo_mini_batch_size x n
    for k in range(SYNC_STEPS):  # each mini-batch's token count, summed over its micro-batches on every rank
        chunk = [c for r in ranks for c in r["calls"][k * per_mini : (k + 1) * per_mini]]
        assert {c["global_batch_info"]["batch_num_tokens"] for c in chunk} == {sum(c["tokens"] for c in chunk)}


@pytest.mark.slow
@pytest.mark.parametrize(("world", "name"), CASES)
def test_v1_step_equals_vespos_own_replay_of_the_sync_cycle(runs, world, name):
    """Mini-batch k's loss as veRL reports it == vespo.compute_policy_loss at the weights after k SGD steps with
    pi_old = the cycle's first weights; the weights after the 4 updates equal the replay's."""
    r = runs[world][0][name]
    assert r["params_compared"] == 30  # every parameter tensor of the tiny Llama, in veRL's own gather
    assert r["advantage_err"] < 1e-6  # V1's GRPO advantages (from rm_scores and uids) == the hand formula
    for update, ref in zip(r["updates"], r["ref_losses"], strict=True):
        (loss,) = update["loss"]
        (pg_loss,) = update["actor/pg_loss"]
        assert loss == pytest.approx(ref, abs=1e-5) and pg_loss == pytest.approx(ref, abs=1e-5)
    assert r["param_err"] < 2e-5 and r["moved"] > 0.1, (r["param_err"], r["moved"])  # a real update, replayed
    assert len({round(x, 3) for x in r["ref_losses"]}) == SYNC_STEPS  # four different losses, not one repeated


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_v1_separate_async_keeps_pi_old_for_the_whole_sync_cycle(runs, world):
    """Decoupled mode: the old log-probs of all 4 mini-batches are the cycle's first weights' (save 0, then save /
    restore around each later mini-batch), though the weights have moved by then."""
    expected = ["save 0"] + [
        f"{op} {n}"
        for k in range(1, SYNC_STEPS)
        for op, n in (("save", k), ("restore", 0), ("restore", k), ("clear", k))
    ]
    for r in runs[world]:
        for name in SPEC:
            assert r[name]["snapshots"] == expected
            assert r[name]["old_log_prob_err"] < 1e-5
            # on host memory veRL's FSDP2 snapshot helper returns the live storage: the job clones it (as .cpu()
            # does from a GPU); when veRL copies by itself this fails and tests/integrations/_verl_cpu.py's wrapper
            # can go
            assert r[name]["snapshot_aliases"] is True
    drift = runs[world][0]["vespo"]["drift"]  # max |log pi_k - log pi_old| over mini-batch k's tokens
    assert drift[0] == 0 and min(drift[1:]) > 0.1  # without the snapshot, mini-batches 1-3 would see pi_k


def _trainer_config(overrides: list[str]):
    """veRL's ppo_trainer config with these overrides, composed and resolved as veRL's main_ppo does."""
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    cfg_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


def _v1_example(**env):
    """The config examples/verl/v1_separate_async_megatron.sh launches, and its override lines."""
    out = subprocess.run(
        ["bash", os.path.join(EXAMPLES, "v1_separate_async_megatron.sh")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env, "VESPO_DRY_RUN": "1"},
    ).stdout.splitlines()
    assert out[0] == "--config-name=ppo_trainer"
    return _trainer_config(out[1:]), out[1:]


def test_v1_separate_async_example_composes_with_verls_v1_config():
    """The example against veRL's V1 schema: the official recipe's headline setting, what V1's separate_async
    trainer and replay buffer assert, vespo's loss in decoupled mode with an untruncated sequence weight."""
    from verl.trainer.config import HybridRolloutSwitchConfig
    from verl.trainer.ppo.rollout_corr_helper import SAFETY_BOUND
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from vespo.integrations.verl import VespoPolicyLossConfig

    cfg, overrides = _v1_example()
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))  # main_ppo's
    v1 = cfg.trainer.v1
    assert cfg.trainer.use_v1 is True and get_trainer_cls(v1.trainer_mode) is PPOTrainerSeparateAsync
    # PPOTrainerSeparateAsync.__init__'s assertions
    assert (
        cfg.data.train_batch_size
        == v1.separate_async.parameter_sync_step * cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    )
    assert (v1.separate_async.parameter_sync_step, cfg.actor_rollout_ref.actor.ppo_mini_batch_size) == (4, 256)
    assert cfg.actor_rollout_ref.rollout.nnodes == 6 and cfg.actor_rollout_ref.rollout.n_gpus_per_node == 8
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl" and cfg.trainer.nnodes == 2
    assert cfg.actor_rollout_ref.hybrid_engine is False and cfg.actor_rollout_ref.actor.strategy == "megatron"
    assert cfg.actor_rollout_ref.actor.megatron.expert_model_parallel_size == 8  # common.sh's MoE lines landed
    assert omega_conf_to_dataclass(v1.separate_async.hybrid_rollout) == HybridRolloutSwitchConfig()  # no switching
    # the replay buffer separate_async builds accepts the staleness bound (an int > 0) and strategy
    ReplayBufferAsync(
        trainer_mode=v1.trainer_mode,
        trainer_config=v1.separate_async,
        max_off_policy_threshold=v1.sampler.max_off_policy_threshold,
        max_off_policy_strategy=v1.sampler.max_off_policy_strategy,
        sampler_kwargs=v1.sampler.sampler_kwargs,
    )
    assert (v1.sampler.max_off_policy_threshold, v1.sampler.max_off_policy_strategy) == (2, "wait")
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True and cfg.actor_rollout_ref.rollout.n == 8
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, VespoPolicyLossConfig) and actor.loss_agg_mode == "token-mean"
    assert actor.policy_loss.loss_mode == "vespo" and actor.policy_loss.rollout_is == "sequence"
    assert actor.policy_loss.hparams == {"c1_pos": 2.0, "c2_pos": 3.0, "c1_neg": 3.0, "c2_neg": 2.0}
    correction = cfg.algorithm.rollout_correction
    assert correction.bypass_mode is False and correction.rollout_is == "sequence"
    assert float(correction.rollout_is_threshold) > math.exp(SAFETY_BOUND)  # never truncates: W = pi / mu exactly
    # bypass mode would let V1 skip the pi_old snapshot and hand old = rollout log-probs: the plugin refuses it
    bypass = _trainer_config([o.replace("bypass_mode=False", "bypass_mode=True") for o in overrides])
    with pytest.raises(Exception, match="bypass_mode"):
        omega_conf_to_dataclass(bypass.actor_rollout_ref.actor)


def test_v1_separate_async_rolls_out_through_the_partial_rollout_client():
    """Partial rollouts are V1 separate_async's own client, not a switch: its trainer asks the standalone rollout
    servers for FullyAsyncLLMServerClient, which keeps an aborted generation's tokens and resumes it."""
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

    class Servers:
        def get_client(self, client_cls):
            return client_cls

    trainer = object.__new__(PPOTrainerSeparateAsync)
    trainer.standalone_server_manager = Servers()
    assert trainer.get_llm_client() is FullyAsyncLLMServerClient
    assert FullyAsyncLLMServerClient.generate is not LLMServerClient.generate  # its own abort-and-resume loop


@pytest.mark.parametrize("env", [{"SYNC_STEPS": "2"}, {"SYNC_STEPS": "8", "MAX_OFF_POLICY": "1"}])
def test_v1_example_keeps_v1s_batch_invariant_under_its_knobs(env):
    """SYNC_STEPS moves data.train_batch_size with it (V1 asserts train batch = sync steps x mini-batch)."""
    cfg, _ = _v1_example(**env)
    steps = int(env["SYNC_STEPS"])
    assert cfg.trainer.v1.separate_async.parameter_sync_step == steps and cfg.data.train_batch_size == steps * 256
    assert cfg.trainer.v1.sampler.max_off_policy_threshold == int(env.get("MAX_OFF_POLICY", 2))
