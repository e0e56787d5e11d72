"""Real architectures nobody here wrote: Hugging Face ``transformers`` models as their users write them, planned,
measured and (optionally) built: the held-out set of #66.

Each model is built from its config with seeded weights (no download) by a factory that returns the model as
``transformers`` makes it (called by keyword, returning a ``ModelOutput``), and given to modak as a
``model.pytorch`` job with its real input names. Per model the table prints: whether it plans (else the error),
the first plan's export seconds, the candidates' runtimes, the zero-shot pick's measured step over the measured
best's, the measured pick's (the fastest of the predicted best of each runtime and precision, what a plan that
measures before choosing takes) over the best's, and the zero-shot pick's prediction error. The best is the
fastest of everything measured: the predicted best of each runtime and precision, and the plan's top ``--top``.

None of these architectures enters ``perfmodels/``: the measurements go to a temporary store. Run it on a quiet
machine (nothing else running; name the CPU with the table):

    flock -x /tmp/modak-quiet.lock python -m benchmarks.models.wild [--target TARGET] [--rounds 3] [--top 3]
        [--models vit swin ...]
    python -m benchmarks.models.wild --max-compile-seconds 60    # without the candidates that tune for minutes
    python -m benchmarks.models.wild --plan-only    # plans (yes/no), export seconds and the candidates' runtimes
    python -m benchmarks.models.wild --quick        # one launch of a fraction of a second: the pipeline, not a
                                                    # measurement
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modak import api
from modak.bench.harness import BenchSettings
from modak.errors import ModakError
from modak.measurements.store import PerfStore
from modak.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TARGET = ROOT / "examples" / "own-model-cpu" / "target.yaml"  # cpu: local, this machine
# The factories, as a user's model file: the architectures at small sizes (2 cores), each returning what
# transformers builds, untouched.
FACTORIES = '''\
import transformers as t

TEXT = dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)
DECODER = dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2)
VISION = dict(image_size=64, patch_size=8, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=256)


def vit():
    return t.ViTForImageClassification(t.ViTConfig(**VISION, num_labels=10))


def deit():
    return t.DeiTModel(t.DeiTConfig(**VISION))


def beit():
    return t.BeitModel(t.BeitConfig(**VISION))


def swin():
    return t.SwinForImageClassification(t.SwinConfig(image_size=64, embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                                                      window_size=4, num_labels=10))


def mobilevit():
    return t.MobileViTForImageClassification(t.MobileViTConfig(image_size=64, num_labels=10))


def convnext():
    return t.ConvNextForImageClassification(t.ConvNextConfig(hidden_sizes=[24, 48, 96, 192], depths=[1, 1, 2, 1],
                                                             num_labels=10))


def resnet():
    return t.ResNetForImageClassification(t.ResNetConfig(hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1],
                                                         embedding_size=32, num_labels=10))


def regnet():
    return t.RegNetModel(t.RegNetConfig(hidden_sizes=[24, 48, 96, 192], depths=[1, 1, 2, 1], groups_width=8))


def mobilenet_v2():
    return t.MobileNetV2ForImageClassification(t.MobileNetV2Config(image_size=64, depth_multiplier=0.5,
                                                                   num_labels=10))


def segformer():
    return t.SegformerForSemanticSegmentation(t.SegformerConfig(num_encoder_blocks=2, depths=[1, 1],
                                                                sr_ratios=[2, 1], hidden_sizes=[32, 64],
                                                                num_attention_heads=[1, 2], decoder_hidden_size=64,
                                                                num_labels=5))


def bert():
    return t.BertForSequenceClassification(t.BertConfig(**TEXT, num_labels=2))


def distilbert():
    return t.DistilBertModel(t.DistilBertConfig(vocab_size=1000, dim=128, n_layers=2, n_heads=4, hidden_dim=256))


def roberta():
    return t.RobertaModel(t.RobertaConfig(**TEXT))


def albert():
    return t.AlbertModel(t.AlbertConfig(**TEXT, embedding_size=64))


def electra():
    return t.ElectraForSequenceClassification(t.ElectraConfig(**TEXT, embedding_size=64, num_labels=2))


def deberta_v2():
    return t.DebertaV2Model(t.DebertaV2Config(**TEXT))


def t5_encoder():
    return t.T5EncoderModel(t.T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4))


def gpt2():
    return t.GPT2LMHeadModel(t.GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=4, n_positions=128))


def llama():
    return t.LlamaForCausalLM(t.LlamaConfig(**DECODER))


def qwen2():
    return t.Qwen2ForCausalLM(t.Qwen2Config(**DECODER))


def mistral():
    return t.MistralForCausalLM(t.MistralConfig(**DECODER))


def whisper_encoder():
    return t.WhisperModel(t.WhisperConfig(d_model=128, encoder_layers=2, decoder_layers=2,
                                          encoder_attention_heads=4, decoder_attention_heads=4,
                                          encoder_ffn_dim=256, decoder_ffn_dim=256, num_mel_bins=80,
                                          max_source_positions=64)).get_encoder()


def wav2vec2():
    return t.Wav2Vec2Model(t.Wav2Vec2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=256, conv_dim=[32] * 7))
'''


@dataclass(frozen=True)
class Architecture:
    """One factory of :data:`FACTORIES` and its inputs as the model names them."""

    name: str
    family: str
    inputs: dict[str, list[int]]
    dtypes: dict[str, Any] = field(default_factory=dict)  # model.input_dtype / input_high of int64 inputs


IMAGE = {"pixel_values": [3, 64, 64]}
TOKENS = {"input_ids": [64], "attention_mask": [64]}
TOKEN_TYPES = {"input_dtype": "int64", "input_high": {"input_ids": 1000, "attention_mask": 2}}
ARCHITECTURES = (
    *(Architecture(name, "vision transformer", IMAGE) for name in ("vit", "deit", "beit", "swin", "mobilevit")),
    *(Architecture(name, "cnn", IMAGE) for name in ("convnext", "resnet", "regnet", "mobilenet_v2")),
    Architecture("segformer", "segmentation", IMAGE),
    *(Architecture(name, "encoder", TOKENS, TOKEN_TYPES)
      for name in ("bert", "distilbert", "roberta", "albert", "electra", "deberta_v2", "t5_encoder")),
    *(Architecture(name, "decoder", TOKENS, TOKEN_TYPES) for name in ("gpt2", "llama", "qwen2", "mistral")),
    Architecture("whisper_encoder", "speech", {"input_features": [80, 128]}),
    Architecture("wav2vec2", "speech", {"input_values": [4000]}),
)
BATCH = 4


@dataclass
class Row:
    """What the table says of one architecture."""

    name: str
    family: str
    planned: bool
    error: str = ""
    export_s: float | None = None
    runtimes: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    pick: float | None = None  # the zero-shot pick's measured step over the best's
    measured_pick: float | None = None  # the measured pick's over the best's
    error_pct: float | None = None  # the zero-shot pick's prediction error, (predicted - measured) / measured
    names: list[str] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=DEFAULT_TARGET, help="target spec (default: this machine)")
    parser.add_argument("--top", type=int, default=3, help="the plan's top candidates measured besides the "
                                                           "best of each runtime and precision (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="launches of each candidate, one per round")
    parser.add_argument("--models", nargs="+", choices=[a.name for a in ARCHITECTURES], help="default: all")
    parser.add_argument("--plan-only", action="store_true", help="plan only: no measurement")
    parser.add_argument("--quick", action="store_true", help="one launch of a fraction of a second per candidate")
    parser.add_argument("--max-compile-seconds", type=float, metavar="SECONDS",
                        help="the jobs' constraints.max_compile_seconds: leaves out the candidates predicted to "
                             "compile or tune longer (TVM's MetaSchedule: minutes per launch)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    settings = (BenchSettings(launches=1, min_seconds=0.05, budget_s=0.2, retries=0) if args.quick
                else BenchSettings(launches=1, min_seconds=0.5, budget_s=2.0))
    rounds = 1 if args.quick else args.rounds
    print(f"CPU: {_cpu()}", flush=True)
    print(f"{'model':<16} {'family':<19} {'plans':<5} {'export s':>8} {'pick/best':>9} {'measured/best':>13} "
          f"{'pred err':>8}  runtimes", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="modak-wild-") as tmp, PerfStore(Path(tmp) / "wild.sqlite") as store:
        folder = Path(tmp)
        (folder / "hf_models.py").write_text(FACTORIES)
        for architecture in ARCHITECTURES:
            if args.models and architecture.name not in args.models:
                continue
            row, plan = plan_row(folder, architecture, args.target.resolve(), args.max_compile_seconds)
            if plan is not None and not args.plan_only:
                measure(row, plan, rounds, settings, store, args.top)
            rows.append(row)
            print(_line(row), flush=True)
    planned = sum(r.planned for r in rows)
    print(f"planned: {planned} of {len(rows)}", flush=True)
    measured = [r for r in rows if r.measured_pick is not None]
    if measured:
        within = sum(r.pick <= 1.05 for r in measured if r.pick is not None)
        measured_within = sum(r.measured_pick <= 1.05 for r in measured if r.measured_pick is not None)
        print(f"zero-shot pick within 5% of the best: {within} of {len(measured)} (a pick that failed is a miss); "
              f"measured pick: {measured_within} of {len(measured)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1, default=list))
    return 0


def plan_row(folder: Path, architecture: Architecture, target: Path,
             max_compile_seconds: float | None = None) -> tuple[Row, Plan | None]:
    """``architecture`` planned as a module job: its row, and the plan (None where it did not plan)."""
    job = folder / f"{architecture.name}.yaml"
    job.write_text(yaml.safe_dump({
        "apiVersion": "modak/v1", "kind": "Job", "name": architecture.name.replace("_", "-"),
        "target": str(target), "task": "inference", "precision": ["fp32", "bf16"],
        "objective": {"metric": "latency"},
        "model": {"pytorch": {"module": "hf_models.py", "factory": architecture.name},
                  "input_shape": architecture.inputs, **architecture.dtypes, "batch_size": BATCH},
        **({"constraints": {"max_compile_seconds": max_compile_seconds}} if max_compile_seconds else {})},
        sort_keys=False))
    try:
        plan = api.plan_job(job)
    except ModakError as exc:
        return Row(architecture.name, architecture.family, False, error=" ".join(str(exc).split())[:300]), None
    user = plan.source.user
    assert user is not None
    return Row(architecture.name, architecture.family, True, export_s=user.export_seconds,
               runtimes=tuple(sorted({r.candidate.runtime for r in plan.ranked})),
               dropped=user.dropped_outputs), plan


def measure(row: Row, plan: Plan, rounds: int, settings: BenchSettings, store: PerfStore, top: int) -> None:
    """Measure the plan's predicted best of each runtime and precision and its top ``top``; fill the ratios."""
    from benchmarks.tools.zoo_jobs import measure_plans

    best_of: dict[tuple[str, str], Any] = {}
    for ranked in plan.ranked:
        best_of.setdefault((ranked.candidate.runtime, ranked.candidate.precision.value), ranked)
    chosen = {ranked.candidate.name: ranked for ranked in (*plan.ranked[:top], *best_of.values())}
    pairs = {name: (plan, ranked.candidate) for name, ranked in chosen.items()}
    medians = {name: s for name, s in measure_plans(pairs, rounds, settings, store).items() if s is not None}
    pick = plan.choice.candidate.name
    if pick not in medians:  # it failed to run, or its output failed the reference check: a miss
        row.error = f"the zero-shot pick {pick} failed: {_failure(store, plan, plan.choice.candidate)}"
    if not medians:
        return
    best = min(medians.values())
    per_runtime = [medians[r.candidate.name] for r in best_of.values() if r.candidate.name in medians]
    row.measured_pick = min(per_runtime) / best if per_runtime else None
    fastest = min(medians, key=medians.__getitem__)
    row.names = [f"best {fastest} {best * 1e3:.2f} ms"]
    if pick in medians:
        row.pick = medians[pick] / best
        row.error_pct = 100 * (plan.choice.prediction.step_seconds - medians[pick]) / medians[pick]
        row.names.insert(0, f"pick {pick} {medians[pick] * 1e3:.2f} ms")


def _failure(store: PerfStore, plan: Plan, candidate: Any) -> str:
    """The status and error of the latest row of ``candidate`` of ``plan``'s workload in ``store``."""
    from modak.predict.measured import measures

    rows = [r for r in store.rows(machine=plan.loaded.target.name, model=plan.workload.model_name)
            if measures(r, candidate)]
    return f"{rows[-1].status}: {rows[-1].error}" if rows else "no row"


def _line(row: Row) -> str:
    if not row.planned:
        return f"{row.name:<16} {row.family:<19} {'no':<5}  {row.error}"

    def ratio(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None else "-"

    error = f"{row.error_pct:+.0f}%" if row.error_pct is not None else "-"
    text = (f"{row.name:<16} {row.family:<19} {'yes':<5} {row.export_s or 0:8.1f} {ratio(row.pick):>9} "
            f"{ratio(row.measured_pick):>13} {error:>8}  {','.join(row.runtimes)}")
    extra = [*row.names, *(f"left out of the export: {d}" for d in row.dropped), *([row.error] if row.error else [])]
    return "\n".join([text, *(f"    {line}" for line in extra)])


def _cpu() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = "unknown"
    cores = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    return f"{model}, {cores} cores, {time.strftime('%Y-%m-%d')}"


if __name__ == "__main__":
    sys.exit(main())
