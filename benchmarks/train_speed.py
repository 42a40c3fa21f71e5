"""Stage II training speed on ``llama_layer`` (240 ops) on ``p100x4``, side by side in one run.

    python benchmarks/train_speed.py [--episodes 1024]

Rows (all our own code, same networks, same simulator):
1. ``doppler (default)``: B episodes per update share one encoder pass; compiled
   rollout without gradients, then one batched differentiable re-scoring pass; a
   local search from the incumbent every 500 episodes (expert iteration);
   then the same without the local searches (``search_every=0``);
2. the same with one more torch thread (2 instead of 1 by default);
   then the default with B = 32;
3. ``per-step autograd, B``: the same batch, but each step's SEL/PLC scores are
   torch ops kept in the autograd graph (a Python loop of |V| steps, as a
   straightforward PyTorch implementation does) - what re-scoring replaces;
4. ``paper-like``: one episode per update (B = 1), the encoder once per episode
   (as the paper), our compiled rollout;
5. ``paper-like, per-step autograd``: B = 1 and the per-step torch loop.

Prints episodes/s, the time for 8000 episodes, the speed-up of the default over each
row, and where the default's time goes. Target: >= 20 episodes/s on 2 CPU cores
(the paper's code: 1.7 s per episode on a 229-op graph on a CPU).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from doppler import cluster, workloads
from doppler.listsched import PlacementState
from doppler.policy.networks import LEAK
from doppler.train import Trainer, TrainConfig


def per_step_autograd_update(tr: Trainer, batch: int) -> None:
    """One REINFORCE update whose rollout keeps every step's scores in the autograd graph."""
    task, cfg = tr.tasks[0], tr.cfg
    gf, g = task.features, task.graph
    n, nd = g.num_ops, gf.num_devices
    device = tr.policy.device
    tr.optimizer.zero_grad()
    enc = tr.policy.encode(gf)
    state = PlacementState(g, gf.costs, batch=batch)
    indeg = np.tile(np.diff(g.pred_ptr), (batch, 1))
    ready = indeg == 0
    placed = enc.plc_init.unsqueeze(0).repeat(batch, 1, 1).to(device)  # zeros, or each device's learned state
    m = enc.plc_op.shape[1]
    logp = torch.zeros(batch, device=device)
    rows = np.arange(batch)
    for _ in range(n):
        scores = enc.sel_score.expand(batch, n).masked_fill(torch.from_numpy(~ready).to(device), -torch.inf)
        sel = torch.distributions.Categorical(logits=scores)
        ops = sel.sample()
        ops_np = ops.cpu().numpy()
        feats = state.features(ops_np)
        x = torch.from_numpy(feats).float().to(device)
        x[..., :-1] /= gf.time_scale_s
        pre = x @ enc.plc_dev + enc.plc_op[ops].unsqueeze(1) + placed[..., :m]
        affinity = (placed[..., m:] * enc.plc_query[ops].unsqueeze(1)).sum(-1)
        logits = torch.nn.functional.leaky_relu(pre, LEAK) @ enc.plc_w_out + enc.plc_b_out + affinity
        plc = torch.distributions.Categorical(logits=logits)
        devs = plc.sample()
        logp = logp + sel.log_prob(ops) + plc.log_prob(devs)
        devs_np = devs.cpu().numpy()
        state.place(ops_np, devs_np, feats[rows, devs_np, 4])
        placed = placed + torch.nn.functional.one_hot(devs, nd).unsqueeze(-1) * enc.plc_placed[ops].unsqueeze(1)
        ready[rows, ops_np] = False
        for b, v in enumerate(ops_np):
            succ = g.succ_idx[g.succ_ptr[v] : g.succ_ptr[v + 1]]
            indeg[b, succ] -= 1
            ready[b, succ[indeg[b, succ] == 0]] = True
    mk = task.oracle.evaluate(state.dev)
    cost = mk / task.lower_bound_s
    adv = (torch.from_numpy(cost.mean() - cost).float() if batch > 1 else torch.zeros(1)).to(device)
    (-(adv * logp).mean() / n).backward()
    torch.nn.utils.clip_grad_norm_(tr.policy.parameters(), cfg.max_grad_norm)
    tr.optimizer.step()
    tr.episode += batch


def measure(name: str, cfg: TrainConfig, episodes: int, per_step: bool = False) -> dict:
    g = workloads.build("llama_layer")
    tr = Trainer.create([g], cluster("p100x4"), cfg)
    cfg.episodes = 10**9  # keep lr/eps schedules from ending during the measurement
    update = (lambda: per_step_autograd_update(tr, cfg.batch)) if per_step else tr.rl_update
    update()  # warm-up: compiled loops loaded, allocator warm
    tr.phase_s.clear()
    start_ep = tr.episode
    t0 = time.perf_counter()
    while tr.episode - start_ep < episodes:
        update()
    elapsed = time.perf_counter() - t0
    done = tr.episode - start_ep
    return {"name": name, "eps_per_s": done / elapsed, "episodes": done, "elapsed_s": elapsed, "phases": dict(tr.phase_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=1024, help="episodes per batched row (B=1 rows run 1/8 of them)")
    ap.add_argument("--device", default="cpu", help="where the networks run (cpu, cuda)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the default rows (the second row uses the other of 1 and 2)")
    args = ap.parse_args()
    default = TrainConfig()
    dev, th = args.device, args.threads
    rows = [
        measure(f"doppler (default: B={default.batch}, {th} thread(s), {dev})", TrainConfig(device=dev, torch_threads=th), args.episodes),
        measure("the same without the local searches", TrainConfig(device=dev, torch_threads=th, search_every=0), args.episodes),
        measure(f"doppler, B={default.batch}, {3 - th} torch thread(s)", TrainConfig(device=dev, torch_threads=3 - th), args.episodes),
        measure("doppler, B=32", TrainConfig(device=dev, torch_threads=th, batch=32), args.episodes),
        measure(f"per-step autograd, B={default.batch}", TrainConfig(device=dev, torch_threads=th), args.episodes // 4, per_step=True),
        measure("paper-like: B=1, encoder per episode", TrainConfig(device=dev, torch_threads=th, batch=1, baseline="running"),
                args.episodes // 8),
        measure("paper-like, per-step autograd, B=1", TrainConfig(device=dev, torch_threads=th, batch=1, baseline="running"),
                args.episodes // 16, per_step=True),
    ]  # fmt: skip
    base = rows[0]["eps_per_s"]
    print(f"Stage II on llama_layer (240 ops), p100x4, torch {torch.__version__}, networks on {dev}")
    print(f"{'configuration':44s} {'episodes/s':>11s} {'8000 episodes':>14s} {'default is x faster':>20s}")
    for r in rows:
        print(f"{r['name']:44s} {r['eps_per_s']:11.1f} {8000 / r['eps_per_s']:12.0f} s {base / r['eps_per_s']:19.1f}x")
    ph = rows[0]["phases"]
    total = rows[0]["elapsed_s"]
    print("\nwhere the default's time goes (per episode):")
    for k, v in sorted(ph.items(), key=lambda kv: -kv[1]):
        print(f"  {k:10s} {v / rows[0]['episodes'] * 1e3:7.2f} ms  ({v / total:5.1%})")
    other = total - sum(ph.values())
    print(f"  {'other':10s} {other / rows[0]['episodes'] * 1e3:7.2f} ms  ({other / total:5.1%})")
    print(f"\ntarget >= 20 episodes/s: {'met' if base >= 20 else 'MISSED'} ({base:.1f})")


if __name__ == "__main__":
    main()
