"""The spec's field types: the immutable base of every spec struct, free text, counts, and the patterns of the
user's Python names, with what the loader says when a value does not match (:mod:`modak.spec.loader`)."""

from __future__ import annotations

from typing import Annotated, get_args

from msgspec import Meta, Struct

# A name that is safe as an image tag, a file name, a Slurm job name and a label value.
Name = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
# An OCI image reference (registry/path:tag@digest) without whitespace or shell metacharacters.
ImageRef = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9._\-/:@]*$", max_length=255)]
# Scheduler fields (partition, account, qos) are written into #SBATCH/#PBS directives.
SchedulerWord = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]+$", max_length=64)]
TimeLimit = Annotated[str, Meta(pattern=r"^(\d+-)?\d{1,3}:\d{2}(:\d{2})?$")]
Url = Annotated[str, Meta(pattern=r"^https?://[^\s'\"`$\\]+$")]
# A pip requirement: letters, digits and the operators of PEP 508 version specifiers, no URLs or options.
_REQUIREMENT = r"^[A-Za-z0-9][A-Za-z0-9._\-\[\],]*[ ]*([<>=!~]=?[ ]*[A-Za-z0-9.*+!\-]+[ ]*,?[ ]*)*$"
Requirement = Annotated[str, Meta(pattern=_REQUIREMENT)]
# Free text that becomes a path or a program argument (it is quoted where written, but NUL cannot be passed on).
Text = Annotated[str, Meta(pattern=r"^[^\x00]*$")]
PositiveInt = Annotated[int, Meta(gt=0)]
PositiveFloat = Annotated[float, Meta(gt=0)]


class Strict(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base: unknown fields are errors, instances are immutable. Fields are checked where data becomes a spec
    (:func:`modak.spec.loader.validate`), not by the constructor."""


# A Python identifier (a factory or function name) and a module: a .py file relative to the job file, or a dotted
# importable name (mypkg.models).
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = rf"([A-Za-z0-9_./-]+\.py|{_IDENTIFIER}(\.{_IDENTIFIER})*)"
PythonName = Annotated[str, Meta(pattern=rf"^{_IDENTIFIER}$", max_length=128)]
PythonModule = Annotated[str, Meta(pattern=rf"^{_MODULE}$", max_length=255)]
BUILTIN_LOSSES = ("cross_entropy", "mse")  # job.loss built-ins: class labels / targets shaped like the outputs
# A built-in loss or module:function.
Loss = Annotated[str, Meta(pattern=rf"^({'|'.join(BUILTIN_LOSSES)}|{_MODULE}:{_IDENTIFIER})$", max_length=255)]
UserFunction = Annotated[str, Meta(pattern=rf"^{_MODULE}:{_IDENTIFIER}$", max_length=255)]  # module:function
# What the loader says of a string that does not match its field's pattern, by pattern (default: PATTERN_MESSAGE).
PATTERN_MESSAGES = {
    get_args(Text)[1].pattern: "cannot contain the NUL character (\\x00): no path or program argument can",
    get_args(Loss)[1].pattern: f"expected a built-in loss ({', '.join(BUILTIN_LOSSES)}) or module:function "
                               f"(model.py:my_loss, mypkg.losses:my_loss)",
    get_args(UserFunction)[1].pattern: "expected module:function (pre.py:encode, mypkg.serving:encode)",
}
PATTERN_MESSAGE = ("this field ends up in image tags, labels or scheduler directives, so only letters, digits and "
                   ". _ - (and / : @ in references) are allowed")
