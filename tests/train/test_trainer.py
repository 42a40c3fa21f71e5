"""Training: imitation reaches the teacher, Stage II improves on it, resume is exact,
checkpoints are safe to load."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from doppler import cluster, workloads
from doppler.hardware.cluster import ClusterError
from doppler.methods import assign
from doppler.sim import simulate
from doppler.policy.rollout import evaluate_actions, rollout
from doppler.policy.architectures import load_policy, read_checkpoint
from doppler.policy.checkpoint import CheckpointError
from doppler.train import Trainer, TrainConfig, TrainError
from doppler.train.losses import advantages, on_policy_nll, policy_gradient_loss
from doppler.train.tasks import greedy_rollout

SMALL = dict(hidden=32, mlp_hidden=32, mp_steps=3)


def test_imitation_reaches_ninety_percent_agreement_with_the_teacher():
    """The mean over three seeds: one run's final agreement is one draw (measured over 3 graphs x 3
    seeds: 0.88-0.97, mean 0.92 with device identity and 0.93 without)."""
    g = workloads.build("random", num_ops=30, seed=1)
    final_plc = []
    for seed in range(3):
        tr = Trainer.create([g], cluster("unit:3"), TrainConfig(stages=("il",), il_episodes=480, il_batch=8, seed=seed,
                                                                 **SMALL))  # fmt: skip
        first = tr.imitation_update()
        tr.run()
        last = tr.history[-1]
        assert first["agree_plc"] < 0.9 and last["agree_plc"] > 0.8, seed  # it had something to learn, and learnt it
        assert last["agree_sel"] > 0.9, seed
        final_plc.append(last["agree_plc"])
    assert np.mean(final_plc) > 0.9, final_plc


def test_a_reinforce_step_raises_the_likelihood_of_better_than_average_episodes():
    # A property of the Stage II update, not of one trajectory: on a fixed batch, a small
    # policy-gradient step must raise sum(advantage * log-likelihood), i.e. shift probability
    # towards the episodes that beat the batch. Holds for every seed and CPU (first order).
    g = workloads.build("random", num_ops=30, seed=0)
    for seed in (0, 1, 2):
        cfg = TrainConfig(stages=("sim",), batch=16, entropy_coef=0.0, self_improve_coef=0.0, seed=seed, **SMALL)
        tr = Trainer.create([g], cluster("p100x4"), cfg)
        task = tr.tasks[0]
        enc = tr.policy.encode(task.features)
        ro = rollout(task.features, enc, batch=cfg.batch, mode="sample", eps=0.0, rng=tr.rng)
        cost = task.oracle.evaluate(ro.assignment) / task.lower_bound_s
        adv = torch.from_numpy(advantages(cost, task, cfg)).float()
        assert (adv > 0).any() and (adv < 0).any()

        def objective() -> float:
            with torch.no_grad():
                sc = evaluate_actions(tr.policy.encode(task.features), ro)
                return float((adv.unsqueeze(1) * (sc.logp_sel + sc.logp_plc)).mean())

        before = objective()
        tr._set_lr(1e-4)
        tr.optimizer.zero_grad()
        policy_gradient_loss(task, tr.policy.encode(task.features), ro, adv, tr.cfg)["loss"].backward()
        tr.optimizer.step()
        assert objective() > before, seed


def test_the_full_stage_two_recipe_beats_the_teacher_where_the_teacher_is_suboptimal():
    # critical_path is 1.50x anneal's makespan here; warm start, expert iteration and
    # distillation make the greedy decode beat it (search, not one lucky REINFORCE trajectory)
    g = workloads.build("random", num_ops=30, seed=0)
    cfg = TrainConfig(stages=("il", "sim"), il_episodes=128, episodes=1000, batch=16, **SMALL)
    tr = Trainer.create([g], cluster("p100x4"), cfg)
    tr.run()
    _, greedy_s = tr.greedy(tr.tasks[0])
    cp = simulate(g, cluster("p100x4"), assign(g, cluster("p100x4"), "critical_path")).makespan_s
    assert greedy_s < 0.9 * cp


def test_distillation_ends_on_the_best_greedy_decode_it_passed_through():
    """Distillation keeps the weights of the best greedy decode it saw (before it, or at any of its
    steps), so its end is never worse than any point it recorded, whatever the trajectory."""
    # a position-free policy, a large step size and few updates: without the restore, the last
    # decode ended 14-22% worse than the best one seen, for seeds 0 and 1 on the machine that wrote this
    g = workloads.build("random", num_ops=60, seed=3)
    for seed in (0, 1):
        cfg = TrainConfig(stages=("il", "sim"), il_episodes=32, episodes=64, batch=8, search_every=32,
                          op_features="structural", search_evals=6000, distill_updates=12, il_lr=5e-2, seed=seed,
                          **SMALL)  # fmt: skip
        tr = Trainer.create([g], cluster("p100x4"), cfg)
        tr.run()
        seen = [h["greedy_ratio"] for h in tr.history if h.get("stage_distill")]
        assert seen, "distillation did not run"
        assert tr._greedy_score() <= min(seen) * (1 + 1e-9), seed
        assert tr.distill_best is None


def test_on_policy_distillation_labels_each_visited_op_with_its_best_device():
    """DAgger for distillation: in the states the greedy decode visits, the label of the op at hand
    is its device in the best assignment. Where the greedy decode is the best trajectory, that is
    the device head's part of the teacher-forced replay; a small step on it raises the labels'
    likelihood in the greedy decode's states (first order: any seed, any CPU)."""
    g = workloads.build("random", num_ops=40, seed=5)
    for seed in (0, 1, 2):
        tr = Trainer.create([g], cluster("p100x4"), TrainConfig(stages=("sim",), seed=seed, **SMALL))
        task = tr.tasks[0]
        enc = tr.policy.encode(task.features)
        ro, _ = greedy_rollout(task, enc)
        task.best_order, task.best_step_device = ro.order[0].copy(), ro.step_device[0].copy()
        task.best_assignment = ro.assignment[0].copy()
        replay = rollout(task.features, enc, batch=1, mode="teacher", order=task.best_order,
                         devices_by_step=task.best_step_device)  # fmt: skip
        want = -evaluate_actions(enc, replay).logp_plc.mean()
        assert torch.allclose(on_policy_nll(task, enc, ro), want, rtol=1e-5)

        rng = np.random.default_rng(seed)  # a best assignment that the greedy decode does not reach
        task.best_assignment = (ro.assignment[0] + rng.integers(1, 4, g.num_ops)) % 4
        before = float(on_policy_nll(task, enc, ro).detach())
        tr._set_lr(1e-4)
        tr.optimizer.zero_grad()
        on_policy_nll(task, enc, ro).backward()
        tr.optimizer.step()
        assert float(on_policy_nll(task, tr.policy.encode(task.features), ro).detach()) < before, seed


def test_device_identity_is_on_by_default_only_for_a_learned_device_head():
    """DOPPLER's device head learns each device's state unless told not to; a policy whose device
    head follows a rule, or a learned baseline, has none; the checkpoint's config says which."""
    assert TrainConfig().learns_device_identity and TrainConfig(method="doppler_plc").learns_device_identity
    assert not TrainConfig(device_identity=False).learns_device_identity
    for method in ("doppler_sel", "gdp", "placeto", "single_policy"):
        assert not TrainConfig(method=method).learns_device_identity, method
    g = workloads.build("random", num_ops=12, seed=1)
    for identity, want in ((None, 4), (False, 0)):
        tr = Trainer.create([g], cluster("p100x4"), TrainConfig(stages=("sim",), device_identity=identity, **SMALL))
        assert tr.cfg.device_identity is bool(want) and tr.policy.config.get("device_identity", 0) == want


def test_the_on_policy_term_is_on_by_default_only_with_device_identity(monkeypatch):
    """Without device identity the term's labels name devices the head cannot tell from their renamed
    copies (measured: it slowed or stopped distillation); with it, it is on unless set."""
    import doppler.train.trainer as trainer_module

    assert TrainConfig(device_identity=False).on_policy_weight == 0.0 and TrainConfig().on_policy_weight == 1.0
    assert TrainConfig(method="gdp").on_policy_weight == 0.0
    assert TrainConfig(device_identity=True, distill_on_policy=0.0).on_policy_weight == 0.0
    assert TrainConfig(distill_on_policy=0.5).on_policy_weight == 0.5
    calls = []
    monkeypatch.setattr(trainer_module, "on_policy_nll", lambda *a: calls.append(1) or on_policy_nll(*a))
    g = workloads.build("random", num_ops=24, seed=1)
    for identity, want in ((False, 0), (True, 1)):
        calls.clear()
        tr = Trainer.create([g], cluster("p100x4"), TrainConfig(stages=("sim",), device_identity=identity, **SMALL))
        task = tr.tasks[0]
        greedy_rollout(task, tr.policy.encode(task.features))  # a best trajectory to distil
        task.best_makespan_s *= 0.5  # that the greedy decode does not match yet
        tr.distill_update()
        assert len(calls) == want, identity


def test_same_seed_runs_are_identical_with_two_torch_threads():
    """With two threads a parallel CPU reduction added in another order from run to run, and such
    runs parted in the seventh digit of their first losses (llama_block / p100x4, seed 0); the
    updates now run with torch's deterministic kernels, and leave the process-wide flag as it was."""
    g, cl = workloads.build("llama_block"), cluster("p100x4")
    runs = []
    for _ in range(2):
        tr = Trainer.create([g], cl, TrainConfig(il_episodes=16, episodes=32, seed=0, search_every=0, distill_updates=0,
                                                 torch_threads=2))  # fmt: skip
        tr.run(None)
        runs.append([(h.get("loss_il"), h.get("loss_pg"), h.get("best_makespan_s")) for h in tr.history])
    assert runs[0] == runs[1]
    assert not torch.are_deterministic_algorithms_enabled()


class Interrupt(Exception):
    pass


def test_kill_and_resume_continues_exactly(tmp_path):
    g = workloads.build("random", num_ops=24, seed=2)
    cl = cluster("unit:2")
    cfg = dict(il_episodes=16, il_batch=8, episodes=96, batch=8, checkpoint_every=32, self_improve_coef=0.5,
               search_every=24, search_evals=300, **SMALL)  # fmt: skip

    full = Trainer.create([g], cl, TrainConfig(**cfg))
    full.run(tmp_path / "full")

    killed = Trainer.create([g], cl, TrainConfig(**cfg))

    def kill_at_64(ev):
        if ev.task == "sim" and ev.done >= 64:
            raise Interrupt  # dies before writing the checkpoint of episode 64

    with pytest.raises(Interrupt):
        killed.run(tmp_path / "killed", kill_at_64)
    ck = read_checkpoint(tmp_path / "killed" / "checkpoint.pt")
    assert ck["episode"] == 32
    resumed = Trainer.resume(tmp_path / "killed", [g], cl)
    resumed.run(tmp_path / "killed")
    assert resumed.episode == full.episode == 96

    def untimed(history):
        return [{k: v for k, v in h.items() if k != "episodes_per_s"} for h in history]

    assert untimed(resumed.history) == untimed(full.history)
    for (k, a), b in zip(full.policy.state_dict().items(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b), k
    np.testing.assert_array_equal(resumed.tasks[0].best_assignment, full.tasks[0].best_assignment)
    with pytest.raises(TrainError, match="trained on cluster 'unit:2', not 'unit:3'"):
        Trainer.resume(tmp_path / "killed", [g], cluster("unit:3"))
    with pytest.raises(TrainError, match="no checkpoint to resume from"):
        Trainer.resume(tmp_path / "nothing", [g], cl)


def test_resume_from_every_checkpoint_a_run_writes_ends_where_the_run_ends(tmp_path, monkeypatch):
    """A kill leaves the last checkpoint the run wrote, whichever it was: resumed from each of them, the run ends
    with the uninterrupted run's weights. Among them are one in the middle of distillation and the one written
    as distillation ends, just before its best weights are restored (a resume from those once restarted the
    comparison from the weights it stopped on, and kept them)."""
    import doppler.train.trainer

    g = workloads.build("random", num_ops=30, seed=0)
    cl = cluster("unit:3")
    cfg = dict(il_episodes=16, episodes=32, batch=8, search_every=16, search_evals=300, distill_updates=7,
               checkpoint_every=2, seed=0, torch_threads=1, **SMALL)  # fmt: skip
    snapshots = []
    write = doppler.train.trainer.write_checkpoint

    def keep_each(run_dir, state, config_json):
        write(run_dir, state, config_json)
        snapshots.append((run_dir / "checkpoint.pt").read_bytes())

    monkeypatch.setattr(doppler.train.trainer, "write_checkpoint", keep_each)
    full = Trainer.create([g], cl, TrainConfig(**cfg))
    full.run(tmp_path / "full")
    monkeypatch.undo()
    cks = [torch.load(io.BytesIO(b), weights_only=True) for b in snapshots]
    assert any(0 < ck["distill_step"] < 7 for ck in cks), "no checkpoint in the middle of distillation"
    ended, restored = cks[-2:]  # distillation's last update, then its best weights restored
    assert not all(torch.equal(a, b) for a, b in zip(ended["state_dict"].values(), restored["state_dict"].values()))
    want = _untimed(cks[-1])
    assert "distill_best" not in want  # the best weights travel in a checkpoint only while distillation runs
    for i, data in enumerate(snapshots):
        (tmp_path / "killed").mkdir(exist_ok=True)
        (tmp_path / "killed" / "checkpoint.pt").write_bytes(data)
        resumed = Trainer.resume(tmp_path / "killed", [g], cl)
        resumed.run(tmp_path / "killed")
        where = f"resumed from checkpoint {i} ({cks[i]['il_episode']}, {cks[i]['episode']}, {cks[i]['distill_step']})"
        _assert_same(want, _untimed(read_checkpoint(tmp_path / "killed" / "checkpoint.pt")), where)


def _untimed(ck: dict) -> dict:
    """A checkpoint less what measures time (its history's episodes per second)."""
    return {**ck, "history": [{k: v for k, v in h.items() if k != "episodes_per_s"} for h in json.loads(ck["history"])]}


def _assert_same(a, b, where: str) -> None:
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, sorted(a), sorted(b))
        for k in a:
            _assert_same(a[k], b[k], f"{where}: [{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}: [{k}]")
    else:
        assert a == b, (where, a, b)


def test_checkpoint_round_trip_and_bad_files(tmp_path):
    g = workloads.build("random", num_ops=20, seed=3)
    tr = Trainer.create([g], cluster("unit:2"), TrainConfig(stages=("il",), il_episodes=8, il_batch=8, **SMALL))
    tr.run(tmp_path)
    policy, meta = load_policy(tmp_path / "checkpoint.pt")
    assert meta["graphs"][0]["fingerprint"] == g.fingerprint()
    for a, b in zip(policy.state_dict().values(), tr.policy.state_dict().values()):
        assert torch.equal(a, b)
    data = (tmp_path / "checkpoint.pt").read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="trunc.pt"):
        load_policy(tmp_path / "trunc.pt")
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a doppler checkpoint"):
        load_policy(tmp_path / "other.pt")
    other = workloads.build("random", num_ops=21, seed=3)
    fresh = Trainer.create([other], cluster("unit:2"), TrainConfig(**SMALL))
    with pytest.raises(TrainError, match="other graphs"):
        fresh.load_state(read_checkpoint(tmp_path))


def test_multi_graph_training_runs_and_transfers_to_an_unseen_graph():
    from doppler.policy.features import graph_features
    from doppler.policy.rollout import rollout

    graphs = [workloads.build("random", num_ops=20, seed=s) for s in (4, 5)]
    tr = Trainer.create(graphs, cluster("unit:3"), TrainConfig(il_episodes=16, il_batch=4, episodes=32, batch=8,
                                                               device_identity=False, **SMALL))  # (identity: unit:3 only)
    tr.run()
    assert tr.episode == 32 and len(tr.tasks) == 2
    unseen = workloads.build("random", num_ops=35, seed=9)
    gf = graph_features(unseen, cluster("unit:4"))  # another size and another device count
    with torch.no_grad():
        ro = rollout(gf, tr.policy.encode(gf), batch=1, mode="greedy")
    assert sorted(ro.order[0].tolist()) == list(range(35))
    assert ro.assignment.max() < 4


@pytest.mark.parametrize("teacher", ["heft", "heft_lookahead"])
def test_another_teacher_is_cloned_and_seeds_the_best_so_far(teacher):
    from doppler import assign, simulate

    g = workloads.build("random", num_ops=30, seed=0)
    cl = cluster("p100x4")
    heft = assign(g, cl, teacher).devices
    cfg = TrainConfig(stages=("il",), teacher=teacher, il_episodes=200, **SMALL)
    tr = Trainer.create([g], cl, cfg)
    task = tr.tasks[0]
    np.testing.assert_array_equal(task.best_assignment, heft)
    assert task.best_makespan_s == pytest.approx(simulate(g, cl, heft).makespan_s)
    tr.run()
    assert tr.il_episode == 200  # one replay of the teacher's trajectory per update
    assert tr.history[-1]["agree_plc"] > 0.9 > tr.history[0]["agree_plc"]


def test_a_non_finite_gradient_skips_the_step():
    g = workloads.build("random", num_ops=20, seed=3)
    tr = Trainer.create([g], cluster("unit:2"), TrainConfig(**SMALL))
    before = [p.detach().clone() for p in tr.policy.parameters()]
    for p in tr.policy.parameters():
        p.grad = torch.zeros_like(p)
    next(tr.policy.parameters()).grad.view(-1)[0] = float("nan")
    assert tr._step() is False
    assert all(torch.equal(a, b) for a, b in zip(before, tr.policy.parameters()))
    for p in tr.policy.parameters():
        p.grad = torch.ones_like(p)
    assert tr._step() is True
    assert not all(torch.equal(a, b) for a, b in zip(before, tr.policy.parameters()))


def _poison_step(monkeypatch, after: int) -> None:
    """Adam's step makes the first weight NaN from its ``after``-th call on (a diverging update, as a damaged
    optimizer state that is finite yet huge makes one)."""
    calls = [0]
    step = torch.optim.Adam.step

    def poisoned(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] > after:
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(torch.optim.Adam, "step", poisoned)


def test_a_diverging_update_stops_the_run_and_keeps_its_last_checkpoint(tmp_path, monkeypatch):
    """A run once saved NaN weights (from a poisoned optimizer state) that its own assign then refused: now the
    update that makes one stops the run, and the run directory keeps its last checkpoint, which loads."""
    from doppler.train import TrainingDiverged

    g = workloads.build("random", size="tiny", num_ops=8)
    cfg = TrainConfig(stages=("il", "sim"), il_episodes=8, il_batch=4, episodes=32, batch=4, checkpoint_every=8,
                      search_every=0, sim_seed_methods=(), distill_updates=0, hidden=8, mlp_hidden=8, mp_steps=1)  # fmt: skip
    saved = []
    monkeypatch.setattr(Trainer, "save", lambda self, d, save=Trainer.save: (save(self, d), saved.append(self.episode)))
    _poison_step(monkeypatch, after=4)  # 2 Stage I updates, then Stage II: the 3rd Stage II update diverges
    tr = Trainer.create([g], cluster("unit:2"), cfg)
    with pytest.raises(TrainingDiverged, match=r"training diverged in the update after 8 Stage I and 8 Stage II "
                                               r"episodes: weight '[\w.]+' holds values that are not finite"):
        tr.run(tmp_path)
    assert saved == [0, 8]  # at the end of Stage I and after 8 Stage II episodes: the last good update's, as it was
    policy, meta = load_policy(tmp_path)
    assert meta["episode"] == 8 and all(bool(torch.isfinite(w).all()) for w in policy.state_dict().values())


def test_no_checkpoint_is_written_with_weights_that_are_not_finite(tmp_path):
    from doppler.policy.checkpoint import write_checkpoint

    g = workloads.build("random", size="tiny", num_ops=8)
    tr = Trainer.create([g], cluster("unit:2"), TrainConfig(hidden=8, mlp_hidden=8, mp_steps=1))
    tr.save(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    state = tr.state()
    state["state_dict"] = {k: v.clone() for k, v in state["state_dict"].items()}  # (not the policy's own)
    state["state_dict"]["sel.mlp.2.bias"][0] = float("inf")
    with pytest.raises(ValueError, match="not saved: weight 'sel.mlp.2.bias' holds values that are not finite"):
        write_checkpoint(tmp_path, state, {})
    state = tr.state()
    state["distill_best"] = {"score": 1.0, "state_dict": {"w": torch.tensor([float("nan")])}}
    with pytest.raises(ValueError, match="not saved: distill_best weight 'w'"):
        write_checkpoint(tmp_path, state, {})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_a_run_longer_than_max_episodes_is_refused_before_it_writes(tmp_path):
    from doppler.train.config import MAX_EPISODES

    g = workloads.build("random", size="tiny", num_ops=8)
    tr = Trainer.create([g], cluster("unit:2"), TrainConfig(episodes=MAX_EPISODES + 1, hidden=8, mlp_hidden=8, mp_steps=1))
    with pytest.raises(TrainError, match=f"--episodes must be at most {MAX_EPISODES:,}"):
        tr.run(tmp_path / "RUN")
    assert not (tmp_path / "RUN").exists()


def test_resume_validates_the_counters_and_the_config_json_before_anything_is_written(tmp_path):
    g = workloads.build("random", size="tiny", num_ops=8)
    cfg = TrainConfig(stages=("il", "sim"), il_episodes=8, il_batch=4, episodes=8, batch=4, search_every=0,
                      sim_seed_methods=(), distill_updates=0, hidden=8, mlp_hidden=8, mp_steps=1)  # fmt: skip
    Trainer.create([g], cluster("unit:2"), cfg).run(tmp_path)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(TrainError, match="--episodes 4: the run in .* has already done 8 Stage II episodes"):
        Trainer.resume(tmp_path, [g], cluster("unit:2"), episodes=4)
    with pytest.raises(TrainError, match=r"--episodes must be at most 1,000,000 \(a doppler train run"):
        Trainer.resume(tmp_path, [g], cluster("unit:2"), episodes=10**7)
    config = json.loads(files["config.json"])
    (tmp_path / "config.json").write_text(json.dumps({**config, "episodes": 10**15}))
    with pytest.raises(TrainError, match="config.json: the run's configuration does not hold"):
        Trainer.resume(tmp_path, [g], cluster("unit:2"))
    (tmp_path / "config.json").write_bytes(files["config.json"])
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == files
    resumed = Trainer.resume(tmp_path, [g], cluster("unit:2"), episodes=12)  # (and the undamaged run resumes)
    resumed.run(tmp_path)
    assert resumed.episode == 12


class TransferCountingOracle:
    """A stand-in "real system" where every transfer costs 1 s and compute is free."""

    def __init__(self, graph) -> None:
        self.graph, self.calls = graph, 0

    def evaluate(self, assignments: np.ndarray) -> np.ndarray:
        self.calls += 1
        g = self.graph
        a = np.asarray(assignments)
        return np.array([1e-3 + float(np.sum(row[g.src] != row[g.dst])) for row in a])


def test_stage_three_uses_the_real_oracle_and_seeds_the_measured_best_baseline(tmp_path):
    g = workloads.build("random", num_ops=24, seed=2)
    cfg = TrainConfig(stages=("il", "sim", "real"), il_episodes=16, episodes=32, real_episodes=32, batch=8,
                      distill_updates=0, **SMALL)  # fmt: skip
    real = TransferCountingOracle(g)
    tr = Trainer.create([g], cluster("unit:2"), cfg, real_oracles={0: real})
    tr.run(tmp_path)
    task = tr.tasks[0]
    assert task.oracle is real and real.calls > 0 and tr.real_episode == 32
    # "single" has no transfers: measured best of the seeds, it is the incumbent Stage III imitates
    assert task.best_makespan_s == pytest.approx(1e-3) and len(np.unique(task.best_assignment)) == 1
    assert any(h["stage_real"] for h in tr.history)
    ck = read_checkpoint(tmp_path / "checkpoint.pt")
    assert ck["real_episode"] == 32


def test_stage_three_without_seeds_keeps_the_simulated_best_remeasured():
    g = workloads.build("random", num_ops=24, seed=2)
    cfg = TrainConfig(stages=("il", "sim"), il_episodes=16, episodes=32, batch=8, distill_updates=0,
                      real_seed_methods=(), **SMALL)  # fmt: skip
    real = TransferCountingOracle(g)
    tr = Trainer.create([g], cluster("unit:2"), cfg, real_oracles={0: real})
    tr.run()
    sim_best = tr.tasks[0].best_assignment.copy()
    tr.enter_real_stage()
    assert tr.tasks[0].best_makespan_s == pytest.approx(real.evaluate(sim_best[None, :])[0])


def test_stage_two_can_start_from_the_best_cheap_method(tmp_path):
    from doppler.train.config import config_from_json

    g = workloads.build("ffnn", size="tiny")
    cl = cluster("p100x4").scaled_links(10)  # slow links: metis's partition is far better than early samples
    methods = ("metis", "round_robin_block", "enumerative")
    best_seed = min(simulate(g, cl, assign(g, cl, m)).makespan_s for m in methods)
    best = {}
    for seeds in (methods, ()):
        cfg = TrainConfig(stages=("il", "sim"), il_episodes=8, episodes=8, batch=4, distill_updates=0,
                          sim_seed_methods=seeds, **SMALL)  # fmt: skip
        tr = Trainer.create([g], cl, cfg)
        tr.run(tmp_path / str(len(seeds)))
        best[seeds] = tr.tasks[0].best_makespan_s
        assert simulate(g, cl, tr.tasks[0].best_assignment).makespan_s == pytest.approx(best[seeds])
    assert best[methods] <= best_seed < best[()]  # without the warm start, 8 episodes do not get there
    saved = json.loads((tmp_path / "3" / "config.json").read_text())
    assert config_from_json(saved).sim_seed_methods == methods


def test_expert_iteration_searches_from_the_incumbent_and_the_policy_imitates_it(tmp_path):
    """A local search from a poor incumbent makes it strictly better, and the result stays a real
    assignment with that simulated makespan, replayed along the b-level order for imitation."""
    g = workloads.build("ffnn", size="tiny")
    cl = cluster("p100x4").scaled_links(10)
    cfg = TrainConfig(stages=("il", "sim"), il_episodes=8, episodes=32, batch=4, distill_updates=0,
                      sim_seed_methods=("round_robin",), search_every=16, search_evals=2000, **SMALL)  # fmt: skip
    tr = Trainer.create([g], cl, cfg)
    task = tr.tasks[0]
    tr.seed_incumbent(task, ("round_robin",))
    before = task.best_makespan_s
    tr.search_incumbent(task, seed=0)
    assert task.best_makespan_s < before
    assert simulate(g, cl, task.best_assignment).makespan_s == pytest.approx(task.best_makespan_s)
    np.testing.assert_array_equal(task.best_order, task.blevel_order())
    np.testing.assert_array_equal(task.best_step_device, task.best_assignment[task.best_order])
    tr.run(tmp_path)  # the whole loop with searches every 16 episodes keeps that invariant
    assert task.best_makespan_s <= before
    assert simulate(g, cl, task.best_assignment).makespan_s == pytest.approx(task.best_makespan_s)
    np.testing.assert_array_equal(task.best_step_device, task.best_assignment[task.best_order])


def test_a_graph_without_work_is_refused_before_training():
    from doppler.ir.graph import DataflowGraph

    g = DataflowGraph.from_arrays([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0, 1], [1, 2])
    with pytest.raises(TrainError, match="lower bound on 'cpu4' is 0"):  # (a GPU preset charges each op a launch)
        Trainer.create([g], cluster("cpu4"), TrainConfig(episodes=16, il_episodes=16))


def test_a_batch_too_large_for_its_graph_is_refused_before_training():
    g = workloads.build("random", num_ops=3000, seed=0)
    with pytest.raises(TrainError, match="--batch 256 x 3,000 ops is more than the 524,288 op-episodes.*--batch 174"):
        Trainer.create([g], cluster("unit:2"), TrainConfig(batch=256, episodes=256))


def test_create_names_a_wrong_object_and_takes_a_preset_name():
    g = workloads.build("random", num_ops=20, seed=0)
    cfg = TrainConfig(stages=("il",), il_episodes=8, hidden=8, mlp_hidden=8, mp_steps=1)
    for args, match in [((g, cluster("unit:2"), cfg), "graphs must be a list of DataflowGraph, got DataflowGraph"),
                        (([None], cluster("unit:2"), cfg), "holding a NoneType"),
                        (([g], cluster("unit:2"), None), "expected a TrainConfig, got NoneType"),
                        (([g, g], cluster("unit:2"), cfg), "graphs 0 and 1 are the same graph")]:  # fmt: skip
        with pytest.raises(TrainError, match=match):
            Trainer.create(*args)
    with pytest.raises(ClusterError, match="a cluster must be a Cluster, a preset name .* got NoneType$"):
        Trainer.create([g], None, cfg)  # resolved as everywhere else (doppler.hardware.presets.cluster)
    assert Trainer.create([g], "unit:2", cfg).tasks[0].cluster.num_devices == 2


def test_with_a_memory_budget_episodes_keep_weights_within_it_and_incumbents_fit():
    """Every sampled and greedy episode puts each op only where its device has room for the weights it adds
    (the rule and the head alike), the log-likelihoods are those of that masked choice, and every incumbent
    (warm start, sample, local search) fits the budget when simulated."""
    import dataclasses

    from doppler import memory

    from doppler.workloads.corpus import gpu_rates
    from doppler.hardware.cluster import homogeneous

    g = workloads.build("llama_block", size="tiny")
    rate, by_kind = gpu_rates(9.3e12, 732e9)  # the paper's P100s with plain per-FLOP rates: heft's free schedule
    c = homogeneous("paper", 4, flops_per_s=rate, flops_per_s_by_kind=by_kind, bandwidth_Bps=12e9, latency_s=1e-5,
                    memory_bytes=16e9)  # overfills a device, leaving a budget under its peak room elsewhere  # fmt: skip
    free = simulate(g, c, assign(g, c, "heft"), trace=True)
    tight = dataclasses.replace(c, devices=[dataclasses.replace(d, memory_bytes=free.peak_memory_bytes.max() * 0.6 / 0.9)
                                            for d in c.devices])  # fmt: skip
    budget = memory.budget_bytes(tight)
    cfg = TrainConfig(stages=("il", "sim"), il_episodes=32, episodes=48, batch=8, distill_updates=5, search_every=16,
                      search_evals=200, **SMALL)  # fmt: skip
    tr = Trainer.create([g], tight, cfg)
    task = tr.tasks[0]
    assert np.array_equal(task.memory_budget_bytes, budget)
    enc = tr.policy.encode(task.features)
    ro = rollout(task.features, enc, batch=6, mode="sample", eps=0.2, rng=np.random.default_rng(0),
                 memory_budget_bytes=budget)  # fmt: skip
    assert ro.room is not None and ro.room[np.arange(6)[:, None], np.arange(g.num_ops), ro.step_device].all()
    for a in ro.assignment:
        assert (memory.resident_bytes(g, a, 4) <= budget).all()
    sc = evaluate_actions(enc, ro)
    assert torch.isinf(sc.plc_logp[torch.from_numpy(~ro.room)]).all()  # no probability where there is no room
    tr.run()
    r = simulate(g, tight, task.best_assignment, trace=True)
    assert (r.peak_memory_bytes <= budget).all()
    unlimited = Trainer.create([g], tight, dataclasses.replace(cfg, memory_fraction=None))
    assert unlimited.tasks[0].memory_budget_bytes is None
