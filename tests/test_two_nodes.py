"""Two nodes, for real (#64 item 6): a data-parallel training job of two tasks, one per node of a two-node Slurm
made of network namespaces (tests/support/slurm_pair.py), runs in a SIF through the job script modak renders:
``modak submit`` hands it to that cluster's ``sbatch``; the script finds the first node for the rendezvous,
``srun`` starts ``apptainer run`` of the SIF on both nodes, and torchrun there starts the user's train.py, which
forms a gloo group across the veth link, trains with DistributedDataParallel and reports its step times. Each task
takes the allocation's one core (the thread policy per task). The measured step goes beside ``modak scale``'s
prediction for two workers (printed here; ``python -m benchmarks.tools.two_nodes`` measures it side by side).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

from modak.build.engines.apptainer import ApptainerEngine
from tests.support.slurm_pair import NODES, SlurmPair, measure_link, write_ddp_job
from tests.test_build import ROOT, build, modak, wheelhouse  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.slow]
STEPS = 40
DONE = re.compile(r"done: (\d+) steps, loss ([\d.]+) -> ([\d.]+), median step ([\d.]+) ms, worker (\d) of (\d) on "
                  r"(\S+)$")


def test_a_data_parallel_job_runs_in_the_sif_on_two_nodes(tmp_path: Path, wheelhouse: Path) -> None:  # noqa: F811
    with SlurmPair(tmp_path / "cluster") as pair:
        link = measure_link(pair)
        job = write_ddp_job(tmp_path / "spec", link, wheelhouse, STEPS)
        out = tmp_path / "out"
        data = build(job, "-o", out)
        plan = json.loads((out / "plan.json").read_text())
        sif = Path(data["image"]["ref"])
        assert data["engine"]["name"] == "apptainer" and sif.is_file()
        digest = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
        assert ApptainerEngine().inspect(str(sif)).labels["io.modak.plan-digest"] == digest
        squash = "--mksquashfs-args '-comp zstd -Xcompression-level 3'"  # the target's sif_compression: zstd
        assert f"apptainer build {squash} cnn-ddp.sif Singularity.def" in (out / "Singularity.def").read_text()
        assert f" {squash} --notest" in (out / "build.log").read_text()
        script = (out / "job.sh").read_text()
        assert "#SBATCH --nodes=2" in script and "#SBATCH --cpus-per-task=1" in script
        assert 'srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 apptainer run "$MODAK_SIF" torchrun ' \
               '--nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d' in script

        submitted = pair.run([sys.executable, "-m", "modak", "submit", job, "-o", out, "--wait", "900", "--json"],
                             timeout=1000, cwd=ROOT)
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        result = json.loads(submitted.stdout)
        output = Path(result["output"])
        log = output.read_text() if output.exists() else "(no output file)"
        assert result["state"] == "COMPLETED" and result["exit_code"] == 0, log[-4000:]

    described = [line for line in log.splitlines() if line.startswith("modak plan: runtime pytorch on cpu")]
    assert len(described) == 2 and all("; 1 threads, worker" in line for line in described), log[-4000:]
    workers = {int(m[5]): m for m in map(DONE.match, log.splitlines()) if m}
    assert sorted(workers) == [0, 1], log[-4000:]
    assert {m[7] for m in workers.values()} == set(NODES)  # one task per node
    for m in workers.values():
        assert (int(m[1]), int(m[6])) == (STEPS, 2) and float(m[3]) < float(m[2]), m[0]  # the loss fell
    measured = max(float(m[4]) for m in workers.values()) / 1e3
    scale = modak("scale", job, "--json")
    assert scale.returncode == 0, scale.stderr
    predicted = next(row for row in json.loads(scale.stdout)["points"] if row["workers"] == 2)
    print(f"\ntwo tasks on two nodes ({link.describe()}): measured step {measured * 1e3:.1f} ms, modak scale "
          f"predicted {predicted['step_seconds'] * 1e3:.1f} ms for 2 workers ({plan['choice']})")

