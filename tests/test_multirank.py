"""Issue 14 (7): multi-rank agreement for real — 4 torch.distributed (gloo) processes on this machine each plan the
model, gather their fingerprints with ``all_gather_object``, and the README's pattern refuses to start when one
rank's AITER differs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

WORKER = textwrap.dedent('''
    import os, sys
    import torch.distributed as dist
    from moedispatch import plan_model
    from moedispatch.data import capdb

    rank, world, store, odd = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    aiter = odd if (odd != "none" and rank == world - 1) else "0.1.15.post3"
    caps = capdb.target_capabilities("gfx950", aiter)           # stands in for this node's probe
    plan = plan_model("amd/MiniMax-M3-MXFP4", caps, tp=8)
    try:
        # -- the README's pattern, verbatim --
        prints = [None] * dist.get_world_size()
        dist.all_gather_object(prints, plan.decision_fingerprint)
        if len(set(prints)) != 1:
            raise SystemExit(f"MoE plans differ across ranks: {sorted(set(prints))} — check GPUs/AITER on every node")
        # -- end --
    except SystemExit as exc:
        # Leave without running gloo's teardown: a peer that already left can make it abort (SIGABRT) under load.
        print(exc, file=sys.stderr, flush=True)
        os._exit(1)
    print(f"rank {rank} agrees: {prints[0]}")
    dist.destroy_process_group()
''')


def _run(tmp_path, odd: str) -> list[subprocess.CompletedProcess]:
    script = tmp_path / "rank.py"
    script.write_text(WORKER)
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "4", str(store), odd], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(4)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def test_four_gloo_ranks_agree_on_one_plan(tmp_path):
    results = _run(tmp_path, "none")
    assert all(r.returncode == 0 for r in results), [r.stderr[-500:] for r in results]
    prints = {r.stdout.split(": ")[-1].strip() for r in results}
    assert len(prints) == 1


def test_one_rank_with_a_different_aiter_makes_every_rank_refuse_to_start(tmp_path):
    """Rank 3 has AITER 0.1.13.post1 (no FlyDSL pad semantics): every rank sees two fingerprints and exits."""
    results = _run(tmp_path, "0.1.13.post1")
    assert all(r.returncode == 1 for r in results), [(r.returncode, r.stderr[-300:]) for r in results]
    assert all("MoE plans differ across ranks" in r.stderr for r in results)
