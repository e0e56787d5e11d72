"""Build caching and image size: a cold ``modak build`` vs a rebuild with no change, and the image's size vs a
stock image of the same framework on the same base, measured side by side in one run.

1. cold: ``modak build`` with every layer rebuilt (the engine's ``nocache``; package downloads included);
2. warm: ``modak build`` again with nothing changed (render included): the goal is <= 10 s, every layer cached;
3. stock: ``FROM`` the same base, ``apt-get install python3-pip``, ``pip install`` of the chosen runtime's
   pinned packages with the defaults a plain Dockerfile has (pip's cache kept, no venv, the same CA bundle and
   wheelhouse so that it gets the same versions), built in the same run for its size.

4. SIF (#64): ``modak build --engine apptainer`` of the same plan (a SIF build has no layer cache: every build is
   cold), and a SIF converted from the Docker image just built (``--oci-archive``'s docker-archive, then
   ``apptainer build x.sif docker-archive://...``), each timed and sized beside the Docker image (skipped, and said,
   where no ``apptainer`` is on PATH; ``--no-sif`` skips them).

Both timings are end to end (rendering, the label stage; no smoke test). Needs the engine that ``modak build``
uses (Podman's service: ``.ci/provision.sh``).

    python -m benchmarks.tools.build_cache [--job examples/mnist-cnn-cpu/job.yaml] [--target T] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from modak import api
from modak.build.engines import BuildLog, Engine, make_engine
from modak.build.pipeline import BuildOptions, build_job, convert_to_sif
from modak.plan import make_plan
from modak.render.ir import build_description
from modak.render.render import sh
from modak.workload.source import load_analysis

GOAL_SECONDS = 10.0
ROOT = Path(__file__).resolve().parents[2]


def stock_image(engine: Engine, ir, out_dir: Path, log: Path) -> str:
    """The stock image of the chosen runtime's packages on the same base; its id."""
    context = Path(tempfile.mkdtemp(prefix="modak-stock."))
    try:
        mounts, options, env = [], [], ""
        if ir.pip.ca_bundle:
            shutil.copy(out_dir / ir.pip.ca_bundle, context / "ca.crt")
            mounts.append("--mount=type=bind,source=ca.crt,target=/run/stock/ca.crt")
            env = "PIP_CERT=/run/stock/ca.crt "
        if ir.pip.wheelhouse:
            shutil.copytree(out_dir / ir.pip.wheelhouse, context / "wheels")
            mounts.append("--mount=type=bind,source=wheels,target=/run/stock/wheels")
            options += ["--find-links", "/run/stock/wheels"]
        for url in ((ir.pip.index_url and ["--index-url", ir.pip.index_url]) or []):
            options.append(url)
        recipe_pins = [r for r in ir.pip.requirements if not r.startswith(("onnx==", "pydantic=="))] \
            or list(ir.pip.requirements)
        lines = [
            f"FROM {ir.base.ref}",
            "RUN apt-get update && apt-get install -y python3 python3-pip ca-certificates",
            f"RUN {' '.join(mounts)} {env}pip install --break-system-packages "
            + " ".join(sh(o) for o in options + recipe_pins),
        ]
        (context / "Dockerfile").write_text("\n".join(lines) + "\n")
        build_log = BuildLog(log)
        try:
            return engine.build(context, build_log)
        finally:
            build_log.close()
    finally:
        shutil.rmtree(context, ignore_errors=True)


def sif_builds(plan, engine: Engine, image_ref: str, folder: Path) -> dict:
    """The plan's SIF built from its definition file, and converted from the Docker image ``image_ref``: seconds
    and bytes of each (or why not: no apptainer here)."""
    if shutil.which("apptainer") is None and shutil.which("singularity") is None:
        return {"missing": "no apptainer or singularity on PATH (.ci/provision.sh apptainer_install)"}
    sif_out = folder / "sif"
    start = time.perf_counter()
    built = build_job(plan, sif_out, BuildOptions(engine="apptainer", smoke=False))
    definition_s = time.perf_counter() - start
    converted = folder / "converted.sif"
    start = time.perf_counter()
    convert_to_sif(engine, image_ref, converted, folder / "convert.log",  # what `modak build --sif` does
                   plan.loaded.target.container)
    converted_s = time.perf_counter() - start
    return {"definition_seconds": round(definition_s, 2), "definition_bytes": Path(built.image_ref).stat().st_size,
            "converted_seconds": round(converted_s, 2), "converted_bytes": converted.stat().st_size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", type=Path, default=ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml")
    parser.add_argument("--target", type=Path)
    parser.add_argument("--engine", choices=["docker", "podman"])
    parser.add_argument("-o", "--output", type=Path, help="build folder (default: a temporary one)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-sif", action="store_true", help="leave out the Apptainer builds")
    args = parser.parse_args()

    loaded = api.load(args.job, args.target)
    plan = make_plan(loaded, *load_analysis(loaded))
    engine = make_engine(args.engine or loaded.target.container.engine)
    engine.check()
    out = args.output or Path(tempfile.mkdtemp(prefix="modak-build-cache.")) / loaded.job.name

    start = time.perf_counter()
    build_job(plan, out, BuildOptions(engine=engine.name, smoke=False, no_cache=True), engine=engine)
    cold_s = time.perf_counter() - start
    cold_log = (out / "build.log").read_text()

    start = time.perf_counter()
    warm = build_job(plan, out, BuildOptions(engine=engine.name, smoke=False), engine=engine)
    warm_s = time.perf_counter() - start
    log = (out / "build.log").read_text().splitlines()
    steps = sum(line.startswith("STEP ") for line in log)
    cached = sum(line.startswith("--> Using cache") for line in log)

    ir = build_description(plan)
    stock_id = stock_image(engine, ir, out, out / "stock-build.log")
    stock = engine.inspect(stock_id)
    modak_size = warm.image.size if warm.image else None
    stock_size = stock.size if stock else None

    sif = None if args.no_sif else sif_builds(plan, engine, warm.image_ref, out.parent)

    result = {
        "sif": sif,
        "job": loaded.job.name, "target": loaded.target.name, "choice": plan.choice.candidate.name,
        "engine": engine.name, "image": warm.image_ref,
        "cold_build_seconds": round(cold_s, 2), "rebuild_seconds": round(warm_s, 2), "goal_seconds": GOAL_SECONDS,
        "rebuild_steps": steps, "rebuild_cached_steps": cached,
        "cold_downloaded": "Downloading" in cold_log,
        "modak_image_bytes": modak_size, "stock_image_bytes": stock_size,
        "stock_packages": [r for r in ir.pip.requirements if not r.startswith(("onnx==", "pydantic=="))],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        mb = lambda n: f"{n / 1e6:.0f} MB" if n else "?"  # noqa: E731
        print(f"{result['job']} on {result['target']}: {result['choice']} ({engine.name})")
        print(f"cold build (no cache):  {cold_s:7.1f} s")
        print(f"no-change rebuild:      {warm_s:7.1f} s  (goal <= {GOAL_SECONDS:g} s: "
              f"{'met' if warm_s <= GOAL_SECONDS else 'MISSED'}; {cached} of {steps - 2} steps after FROM cached)")
        print(f"image size: modak {mb(modak_size)}, stock {mb(stock_size)} "
              f"(pip install {' '.join(result['stock_packages'])} on {ir.base.ref}, plain defaults)")
        if sif is None:
            print("SIF: left out (--no-sif)")
        elif "missing" in sif:
            print(f"SIF: {sif['missing']}")
        else:
            print(f"SIF from Singularity.def (cold, no layer cache): {sif['definition_seconds']:7.1f} s, "
                  f"{mb(sif['definition_bytes'])}")
            print(f"SIF from the Docker image (save + convert):      {sif['converted_seconds']:7.1f} s, "
                  f"{mb(sif['converted_bytes'])}")
    engine.remove(stock_id)
    return 0 if warm_s <= GOAL_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
