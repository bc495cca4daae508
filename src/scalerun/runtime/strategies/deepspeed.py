"""DeepSpeed ZeRO 0-3 behind ``wrap``: the user's ds_config.json or scalerun's options.

The engine does accumulation, clipping and mixed precision itself; this module hands it
the configuration :mod:`.deepspeed_config` decided, casts inputs to the engine's
precision, and writes and reads DeepSpeed's own checkpoint format (converted to the
universal format when the world size or ZeRO stage changes).

``deepspeed`` is an optional extra: it is imported only when this strategy is set up,
and its absence is a one-line error that says how to install it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scalerun.errors import ScalerunError
from scalerun.runtime.context import Context
from scalerun.runtime.strategies.base import OptimizerArg, Strategy, TrainSettings
from scalerun.runtime.strategies.deepspeed_config import (
    DeepSpeedOptions,
    build_config,
    config_source,
    load_config,
)
from scalerun.runtime.strategies.memory import (
    HeldBytes,
    StorageCounter,
    optimizer_tensors,
    split_by_name,
)

CHECKPOINT_TAG = "deepspeed"
UNIVERSAL_FOLDER = "universal"
INSTALL_HINT = "pip install 'scalerun[deepspeed]' (tested with deepspeed 0.19.8)"


def import_deepspeed() -> Any:
    """The deepspeed module, or a one-line error saying how to install it."""
    try:
        import deepspeed
    except ImportError as error:
        raise ScalerunError(
            f"strategy='deepspeed' needs DeepSpeed, which does not import here ({error}); "
            f"install it: {INSTALL_HINT}"
        ) from None
    return deepspeed


class DeepSpeedStrategy(Strategy):
    """The model handed to a DeepSpeed engine; the engine does accumulation and clipping."""

    name = "deepspeed"
    checkpoint_format = "deepspeed"

    def __init__(self, ctx: Context, settings: TrainSettings, options: DeepSpeedOptions) -> None:
        super().__init__(ctx, settings)
        self.options = options
        self.config: dict[str, Any] = {}
        self.compute_dtype: torch.dtype | None = None

    @property
    def zero_stage(self) -> int:
        return int(self.config["zero_optimization"]["stage"])

    @property
    def accumulation(self) -> int:
        return int(self.config["gradient_accumulation_steps"])

    def setup(self, model: nn.Module, optimizer: OptimizerArg) -> None:
        deepspeed = import_deepspeed()
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer(model.parameters())
        self.config = build_config(
            load_config(config_source(self.options.config, os.environ)), self.settings, self.options,
            world_size=self.ctx.world_size, on_cpu=self.ctx.device.type == "cpu",
            client_optimizer=optimizer is not None,
        )
        self._check_device_precision()
        # DeepSpeed picks its device from LOCAL_RANK; under srun with one GPU per task
        # that index does not exist, so it is told the device scalerun chose.
        args = argparse.Namespace(device_rank=self.ctx.device.index) if self.ctx.device.type == "cuda" else None
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            args=args, model=model, optimizer=optimizer, config=self.config,
            model_parameters=None if optimizer is not None else model.parameters(),
        )
        self.engine, self.unwrapped, self.optimizer = engine, engine.module, ds_optimizer
        self.torch_optimizer = optimizer or _inner_torch_optimizer(ds_optimizer)

    def _check_device_precision(self) -> None:
        from deepspeed.accelerator import get_accelerator

        for name, dtype, supported in (
            ("bf16", torch.bfloat16, get_accelerator().is_bf16_supported),
            ("fp16", torch.float16, get_accelerator().is_fp16_supported),
        ):
            if self.config.get(name, {}).get("enabled"):
                if not supported():
                    raise ScalerunError(
                        f"DeepSpeed {name} is not supported on {self.ctx.device}; use another precision"
                    )
                self.compute_dtype = dtype

    def describe(self) -> str:
        precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.compute_dtype, "fp32")
        return (
            f"deepspeed ZeRO-{self.zero_stage} over {self.ctx.world_size} rank(s), {precision}, "
            f"batch {self.config['train_micro_batch_size_per_gpu']} x {self.accumulation} x "
            f"{self.ctx.world_size} = {self.config['train_batch_size']}"
        )

    def prepare_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """DeepSpeed keeps bf16/fp16 weights but leaves inputs alone: cast them here."""
        if self.compute_dtype is None:
            return args, kwargs
        cast = self._cast
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    def _cast(self, value: Any) -> Any:
        if torch.is_tensor(value) and value.is_floating_point():
            return value.to(self.compute_dtype)
        return value

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)  # type: ignore[union-attr]  # divides by accumulation itself

    def step(self, boundary: bool) -> bool:
        engine = self.engine
        ends_cycle = engine.is_gradient_accumulation_boundary()  # type: ignore[union-attr]
        assert ends_cycle == boundary, "scalerun and DeepSpeed disagree on the accumulation cycle"
        engine.step()  # type: ignore[union-attr]
        if ends_cycle and self.settings.clip_grad_norm is not None:
            norm = engine.get_global_grad_norm()  # type: ignore[union-attr]
            self.grad_norm = None if norm is None else torch.as_tensor(float(norm))
        return ends_cycle

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        import deepspeed

        module = self.unwrapped
        assert module is not None
        with deepspeed.zero.GatheredParameters(list(module.parameters()), enabled=self.zero_stage == 3):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}

    def save_state(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory), tag=CHECKPOINT_TAG, save_latest=False)  # type: ignore[union-attr]

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"zero_stage": self.zero_stage}

    def load_state(self, directory: Path, meta: Mapping[str, Any]) -> None:
        saved_world, saved_stage = int(meta["world_size"]), int(meta.get("zero_stage", -1))
        same_layout = saved_world == self.ctx.world_size and saved_stage == self.zero_stage
        if same_layout or saved_stage == self.zero_stage == 0:
            self._load(directory)  # ZeRO-0 state is whole on every rank: any world size
            return
        universal = directory / UNIVERSAL_FOLDER
        self._convert_once(directory, universal, meta)
        with self._universal_loading():
            self._load(universal)

    def _convert_once(self, directory: Path, universal: Path, meta: Mapping[str, Any]) -> None:
        """Rank 0 converts (once per checkpoint: the result is kept beside it) while the
        others wait in the broadcast; every rank learns whether it worked.

        Whatever rank 0 meets is broadcast, not raised there alone: the ranks waiting on
        a rank 0 that left would fail with gloo's "connection closed by peer" once it
        exits (or wait for the timeout), with no word of why.
        """
        failure: list[str | None] = [None]
        if self.ctx.rank == 0 and not (universal / CHECKPOINT_TAG).is_dir():
            try:
                convert_to_universal(directory / CHECKPOINT_TAG, universal, meta, self.describe())
            except ScalerunError as error:
                failure[0] = str(error)
            except Exception as error:  # noqa: BLE001 - every rank must hear of it
                failure[0] = conversion_failure(error, universal)
        if self.ctx.world_size > 1:
            dist.broadcast_object_list(failure, src=0)
        if failure[0] is not None:
            raise ScalerunError(failure[0])

    def _load(self, root: Path) -> None:
        path, _ = self.engine.load_checkpoint(  # type: ignore[union-attr]
            str(root), tag=CHECKPOINT_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise ScalerunError(f"DeepSpeed found no checkpoint under {root / CHECKPOINT_TAG}")

    @contextlib.contextmanager
    def _universal_loading(self):  # noqa: ANN202
        # DeepSpeed reads this flag only while loading; it is normally fixed by the
        # config at start, before anyone knows the checkpoint's world size.
        config = self.engine._config  # type: ignore[union-attr]
        before = config.load_universal_checkpoint
        config.load_universal_checkpoint = True
        try:
            yield
        finally:
            config.load_universal_checkpoint = before

    def held_bytes(self) -> HeldBytes:
        module = self.unwrapped
        assert module is not None
        counter = StorageCounter()
        params = list(module.parameters())
        # ZeRO-3 keeps each rank's slice in ds_tensor; p.data is empty between uses, except
        # for parameters small enough to stay whole ("persistent"), which count in full.
        held = [p.ds_tensor for p in params if hasattr(p, "ds_tensor")] + params
        grads, others = split_by_name(self.optimizer) if self.optimizer is not None else ([], [])
        parameters = counter.count(held)
        gradients = counter.count([p.grad for p in params if p.grad is not None] + grads)
        optimizer = counter.count(optimizer_tensors(self.torch_optimizer) + others)
        return HeldBytes(parameters=parameters, gradients=gradients, optimizer=optimizer)


def _inner_torch_optimizer(ds_optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer a DeepSpeed optimizer wraps (DeepSpeed built it from the config)."""
    inner = getattr(ds_optimizer, "optimizer", ds_optimizer)
    return inner if isinstance(inner, torch.optim.Optimizer) else None


def conversion_failure(error: Exception, universal: Path) -> str:
    """The one line for a conversion that failed other than by DeepSpeed's own refusal."""
    if isinstance(error, OSError):
        return (f"cannot write DeepSpeed's universal checkpoint to {universal} ({error}); loading "
                "at another world size or ZeRO stage converts the checkpoint beside itself: copy "
                "the checkpoint folder to a writable place and load from there")
    return (f"converting to DeepSpeed's universal checkpoint in {universal} failed "
            f"({type(error).__name__}: {' '.join(str(error).split())})")


def convert_to_universal(source: Path, universal_root: Path, meta: Mapping[str, Any], now: str) -> None:
    """DeepSpeed's own ds_to_universal, written to a temporary name and renamed.

    The universal format stores each parameter's optimizer state whole, so any number of
    ranks can load it; DeepSpeed's converter knows Adam-family state only.
    """
    from deepspeed.checkpoint import ds_to_universal

    target = universal_root / CHECKPOINT_TAG
    temporary = universal_root / f".{CHECKPOINT_TAG}.converting"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.parent.mkdir(parents=True, exist_ok=True)
    args = argparse.Namespace(
        input_folder=str(source), output_folder=str(temporary), num_extract_workers=1,
        num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True,
    )
    try:
        with contextlib.redirect_stdout(None):
            ds_to_universal.main(args)
    except (KeyError, AssertionError, ValueError) as error:
        shutil.rmtree(temporary, ignore_errors=True)
        saved = f"ZeRO-{meta.get('zero_stage')} over {meta['world_size']} rank(s)"
        raise ScalerunError(
            f"this DeepSpeed checkpoint ({saved}) cannot be converted to load into {now} "
            f"({type(error).__name__}: {error}); DeepSpeed's universal checkpoint handles "
            f"ZeRO-1/2/3 with Adam/AdamW state only: resume with the saved layout"
        ) from None
    temporary.rename(target)
