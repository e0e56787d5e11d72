"""Expand the runtime catalog into concrete candidates for one job on one target, pruning what cannot run."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from modak.candidates.candidate import Candidate, value_key
from modak.candidates.catalog import DeviceKind, Recipe
from modak.hardware.ceilings import TargetCeilings
from modak.image.deployment import resolve_threads
from modak.spec.loader import LoadedJob
from modak.spec.models import Device


@dataclass(frozen=True)
class Pruned:
    """A runtime (or runtime on a device, or a candidate) left out, and why; ``limit`` names the job's or target's
    limit that excluded it (``constraints.max_latency_ms``, ``memory``, ...), if one did."""

    runtime: str
    reason: str
    limit: str | None = None


@dataclass(frozen=True)
class CandidateSpace:
    candidates: tuple[Candidate, ...]
    pruned: tuple[Pruned, ...]


def enumerate_candidates(loaded: LoadedJob, ceilings: TargetCeilings, catalog: Mapping[str, Recipe],
                         op_classes: frozenset[str], no_onnx: str | None = None) -> CandidateSpace:
    """All candidates the job's constraints and the target's hardware allow, plus the reasons for the rest;
    ``no_onnx``: why the job's model has no ONNX graph (the user's own model that no exporter could export)."""
    job = loaded.job
    unknown = [name for name in job.constraints.runtimes or () if name not in catalog]
    if unknown:
        raise loaded.job_doc.error(("constraints", "runtimes"),
                                   f"no runtime {', '.join(map(repr, unknown))} (known: {', '.join(catalog)}; a "
                                   "runtime outside modak is installed with its entry point in modak.runtimes)")
    candidates: list[Candidate] = []
    pruned: list[Pruned] = []
    seen: set[tuple] = set()
    for recipe in catalog.values():
        reason = _job_excludes(recipe, loaded, no_onnx)
        if reason:
            pruned.append(Pruned(recipe.name, reason))
            continue
        for device in recipe.devices:
            reason = _device_excludes(device, job.device, ceilings)
            if reason:
                pruned.append(Pruned(f"{recipe.name}/{device}", reason))
                continue
            supported = ceilings.gpu if device == "gpu" else ceilings.cpu
            assert supported is not None
            precisions = [p for p in recipe.precisions.get(device, ()) if p in job.precision and supported.supports(p)]
            if not precisions:
                allowed = ", ".join(p.value for p in job.precision)
                pruned.append(Pruned(f"{recipe.name}/{device}", f"no allowed precision ({allowed}) is supported by "
                                                                f"{recipe.title} on {supported.name}"))
                continue
            applicable = [p for p in recipe.parameters if device in p.devices and job.task in p.tasks
                          and (p.needs_op_class is None or p.needs_op_class in op_classes)]
            allocation = loaded.target.scheduler.allocation
            for p in applicable:
                left_out = [value_key(v) for v in p.values if v not in p.values_for(allocation)]
                if left_out:
                    pruned.append(Pruned(f"{recipe.name}/{device}", f"{p.name}={'|'.join(left_out)}: "
                                         f"{value_key(p.allocation[allocation])} wins on {allocation} cores "
                                         f"(target scheduler.allocation)"))
            for precision in precisions:
                params = [p for p in applicable if p.precisions is None or precision in p.precisions]
                for values in itertools.product(*(p.values_for(allocation) for p in params)):
                    settings = tuple(zip((p.name for p in params), values))
                    policy = dict(settings).get("threads")
                    threads = resolve_threads(policy, ceilings.cores) if policy is not None else None
                    key = (recipe.name, device, precision, threads,
                           tuple(s for s in settings if s[0] != "threads"))
                    if key in seen:
                        continue
                    seen.add(key)
                    candidates.append(Candidate(recipe.name, device, precision, settings, threads))
    return CandidateSpace(tuple(candidates), tuple(pruned))


def _job_excludes(recipe: Recipe, loaded: LoadedJob, no_onnx: str | None) -> str | None:
    job = loaded.job
    if job.constraints.runtimes is not None and recipe.name not in job.constraints.runtimes:
        return "not in the job's constraints.runtimes"
    if job.frameworks != "any" and recipe.framework not in job.frameworks:
        return f"framework {recipe.framework} is not in the job's frameworks"
    if job.task not in recipe.tasks:
        return f"does not support {job.task.value}"
    if recipe.model_format == "torch" and job.model.onnx is not None:
        return "needs a PyTorch model (a zoo architecture, model.pytorch or model.exported); the job gives an ONNX file"
    if job.loss is not None and ":" in job.loss and recipe.framework != "pytorch":
        return f"the job's loss {job.loss} is PyTorch code; {recipe.framework} runs the built-in losses only"
    if recipe.model_format == "onnx" and no_onnx is not None:
        return f"needs an ONNX graph: {no_onnx}"
    return None


def _device_excludes(device: DeviceKind, wanted: Device, ceilings: TargetCeilings) -> str | None:
    if wanted is not Device.any and wanted.value != device:
        return f"the job asks for device '{wanted.value}'"
    if device == "gpu" and ceilings.gpu is None:
        return "the target has no GPU"
    return None
