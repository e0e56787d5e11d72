"""XLA through JAX: torchax runs a PyTorch module as a JAX function, compiled by ``jax.jit``.

The model definition is the zoo's own ``torch.nn.Module``, or the user's (:func:`modak.image.runtimes.pytorch.
user_module`): torchax lowers every ATen op to ``jax.numpy``, so
nothing is redefined here. A step is one call of the jitted function, waited on with
``jax.block_until_ready``:

- inference: the forward pass on the request's batch;
- training: forward, the loss of :mod:`modak.image.runtimes.pytorch` (the job's built-in, or the mean square),
  gradients over the trainable parameters (``jax.value_and_grad``) and the ``torch.optim.SGD`` update
  (lr 1e-3, momentum 0.9: ``buf = 0.9 * buf + grad; w -= 1e-3 * buf``), all in one XLA program. Buffers
  (BatchNorm running statistics) are carried from step to step as in torch's train mode.

Compilation (tracing and XLA) happens in :func:`prepare`, which runs the step once on throw-away copies of
the state, so the timed steps and the reference check see the untouched initial weights.

Parameters: ``threads`` (CPU) — XLA sizes its CPU thread pool from the CPUs the process may run on, so a
thread count below the machine's is applied by restricting this process's CPU affinity before JAX starts
(the runner runs each candidate in a fresh process); the recipe's ``XLA_FLAGS`` come from the container
environment. Precisions bf16 (and fp16) compute the whole forward (and backward) in that type: the
step casts the float32 parameters, floating-point buffers and inputs to it, and keeps the float32 master
weights, the update, the loss and the outputs in float32. (torchax's own autocast is not used: with PyTorch
2.13 it leaves ``F.linear`` and convolutions in float32, since its cast table names ops that no longer reach
it.)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from modak.image.runtimes.base import Adapter, FunctionSession, RunRequest, loss_targets

if TYPE_CHECKING:
    import numpy as np

LR = 1e-3
MOMENTUM = 0.9
MISSING_OVERLOADS: list[str] = []  # ATen overloads torchax names that this PyTorch lacks
_LOWER = {"bf16": "bfloat16", "fp16": "float16"}  # compute dtype of the reduced precisions


def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> FunctionSession:
    import numpy as np

    if request.zoo is None and request.pytorch is None:
        raise ValueError("xla runs PyTorch modules (a zoo architecture or the user's own); this request has only an "
                         "ONNX file")
    if request.device == "cpu":
        _limit_threads(request.threads)
    import jax

    torchax = import_torchax()
    if request.zoo is not None:
        from modak.image.zoo import get_entry

        entry = get_entry(request.zoo)
        model, input_names = entry.build(request.input_shapes), list(entry.input_shapes)
    else:
        from modak.image.runtimes.pytorch import user_module

        model, input_names = user_module(request), list(request.input_shapes)
    if request.task == "training":
        model.train()
    device = jax.devices("gpu" if request.device == "gpu" else "cpu")[0]
    env = torchax.default_env()
    jittable = torchax.interop.JittableModule(model)
    params = {k: _to_jax(v, device) for k, v in jittable.params.items()}
    buffers = {k: _to_jax(v, device) for k, v in jittable.buffers.items()}
    args = [jax.device_put(inputs[name], device) for name in input_names]  # the shapes to compile for

    def arguments(feeds: Mapping[str, np.ndarray]) -> list[Any]:
        return [jax.device_put(np.ascontiguousarray(feeds[name]), device) for name in input_names]
    compute = getattr(jax.numpy, _LOWER[request.precision]) if request.precision in _LOWER else None

    def forward(params: dict, buffers: dict, args: list) -> tuple[list, dict]:
        """The module's forward as a JAX function: outputs and the buffers after the call."""
        dtypes = jax.tree.map(lambda a: a.dtype, buffers)
        if compute is not None:  # fp32 master copies stay outside; gradients flow back through the casts
            params, buffers, args = jax.tree.map(lambda a: _cast(a, compute), (params, buffers, args))
        t_params, t_buffers, t_args = env.j2t_iso((params, buffers, args))
        with env:
            outputs = jittable.functional_call("forward", t_params, t_buffers, *t_args)
        outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        # in-place updates (BatchNorm running statistics in train mode) replace the tensors' arrays
        new_buffers = jax.tree.map(lambda new, dtype: new.astype(dtype), env.t2j_iso(t_buffers), dtypes)
        return env.t2j_iso(outputs), new_buffers

    if request.task == "inference":
        @jax.jit
        def infer(params: dict, buffers: dict, args: list) -> list:
            outputs, _ = forward(params, buffers, args)
            return [o.astype(np.float32) for o in outputs]

        jax.block_until_ready(infer(params, buffers, args))  # compile

        def run_inference(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            return [np.asarray(o) for o in jax.block_until_ready(infer(params, buffers, arguments(feeds)))]
        return FunctionSession(run_inference)

    def loss_fn(params: dict, buffers: dict, args: list) -> tuple[Any, dict]:
        outputs, new_buffers = forward(params, buffers, args)
        return _loss(request, outputs), new_buffers

    @jax.jit
    def train_step(params: dict, buffers: dict, momentum: dict, args: list) -> tuple:
        (loss, new_buffers), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, buffers, args)
        momentum = jax.tree.map(lambda m, g: MOMENTUM * m + g, momentum, grads)
        params = jax.tree.map(lambda w, m: w - LR * m, params, momentum)
        return loss, params, new_buffers, momentum

    state = {"params": params, "buffers": buffers,
             "momentum": jax.tree.map(lambda w: jax.numpy.zeros_like(w), params)}
    jax.block_until_ready(train_step(state["params"], state["buffers"], state["momentum"], args))  # compile

    def run_training(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        loss, state["params"], state["buffers"], state["momentum"] = jax.block_until_ready(
            train_step(state["params"], state["buffers"], state["momentum"], arguments(feeds)))
        return [np.asarray(loss, dtype=np.float32)]
    return FunctionSession(run_training)


def _loss(request: RunRequest, outputs: list) -> Any:
    """The loss of :mod:`modak.image.runtimes.pytorch` in ``jax.numpy``: a built-in on the same seeded targets,
    else the mean square of the outputs (a ``module:function`` loss is PyTorch code: the plan leaves XLA out)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    if request.loss is None:
        return sum((o.astype(np.float32) ** 2).mean() for o in outputs)
    if ":" in request.loss:
        raise ValueError(f"xla cannot run the PyTorch loss {request.loss}")
    first = outputs[0].astype(np.float32)
    target = loss_targets(request.loss, tuple(first.shape), request.seed)
    if request.loss == "cross_entropy":
        logits = jax.nn.log_softmax(first.reshape(-1, first.shape[-1]))
        return -jnp.take_along_axis(logits, target.reshape(-1, 1), axis=1).mean()
    return ((first - target) ** 2).mean()


def import_torchax() -> Any:
    """``import torchax``, tolerating the ATen overloads newer PyTorch releases removed.

    torchax 0.0.13 names named-tensor (``Dimname``) overloads in its op tables; PyTorch 2.13 no longer has
    them, so ``import torchax`` fails. While importing it and building its default environment (which loads
    the decomposition table), a missing overload resolves to a unique placeholder that matches no real op
    (those tables only map ops to policies or decompositions); the names are kept in
    :data:`MISSING_OVERLOADS`.
    """
    if "torchax" in sys.modules:
        return sys.modules["torchax"]
    import torch._ops

    packet = torch._ops.OpOverloadPacket
    original = packet.__getattr__

    def tolerant(self: Any, key: str) -> Any:
        try:
            return original(self, key)
        except AttributeError:
            if key.startswith("__"):
                raise
            MISSING_OVERLOADS.append(f"{self}.{key}")
            return object()

    os.environ.setdefault("ENABLE_RUNTIME_UPTIME_TELEMETRY", "0")  # torchax would set it to 1 (TPU runtime)
    setattr(packet, "__getattr__", tolerant)  # noqa: B010 (a method assigned on purpose, restored below)
    try:
        import torchax
        import torchax.amp
        import torchax.interop

        torchax.default_env()  # loads the op tables and decompositions, which name such overloads too
    finally:
        setattr(packet, "__getattr__", original)  # noqa: B010
    return torchax


def _limit_threads(threads: int | None) -> None:
    """Restrict the process to ``threads`` CPUs (XLA's CPU thread pool follows the affinity mask)."""
    if not threads or "jax" in sys.modules or not hasattr(os, "sched_getaffinity"):
        return
    allowed = sorted(os.sched_getaffinity(0))
    if threads < len(allowed):
        os.sched_setaffinity(0, allowed[:threads])


def _cast(array: Any, dtype: Any) -> Any:
    """``array`` in ``dtype`` when it holds floating-point numbers (integer ids and counters stay)."""
    import jax.numpy as jnp

    return array.astype(dtype) if jnp.issubdtype(array.dtype, jnp.floating) else array


def _to_jax(tensor: Any, device: Any) -> Any:
    import jax

    return jax.device_put(tensor.detach().cpu().numpy(), device)


class Xla(Adapter):
    name = "xla"
    framework = "jax"
    packages = ("jax", "jaxlib", "torchax")
    prepare = staticmethod(prepare)
