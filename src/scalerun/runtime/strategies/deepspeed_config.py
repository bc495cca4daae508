"""The DeepSpeed configuration scalerun hands to ``deepspeed.initialize``, decided purely.

Takes the user's ds_config (a file parsed the way DeepSpeed parses it, so the course's
trailing commas are fine, or a dict) and completes it with what scalerun knows: world
size, accumulation, precision, clipping, optimizer. Every contradiction between the
file and ``wrap``'s options is a one-line error naming both sides, and the batch sizes
always satisfy DeepSpeed's rule ``train_batch_size = micro-batch x accumulation x world
size``.

Pure: no deepspeed import (only hjson, to read a file), no process group, no I/O
besides reading the config file. No torch either: ``scalerun launch --deepspeed-config``
reads the file with :func:`load_config` on a login node that may have none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerun import variables
from scalerun.errors import ScalerunError

if TYPE_CHECKING:  # pragma: no cover
    from scalerun.runtime.strategies.base import TrainSettings

DEFAULT_ZERO_STAGE = 2
"""Stage when neither the config nor ``zero_stage=`` says (Lightning's choice too)."""


@dataclass(frozen=True, kw_only=True)
class DeepSpeedOptions:
    """The DeepSpeed-specific knobs of ``wrap``."""

    config: str | Path | Mapping[str, Any] | None = None
    """A ds_config.json path or a dict; scalerun fills in what it leaves out. None: the
    file of ``scalerun launch --deepspeed-config`` ($SCALERUN_DEEPSPEED_CONFIG), if any."""
    zero_stage: int | None = None
    """ZeRO stage 0-3; must agree with the config's when both give one."""


def config_source(
    given: str | Path | Mapping[str, Any] | None, environ: Mapping[str, str]
) -> str | Path | Mapping[str, Any] | None:
    """The config ``wrap`` uses: the code's, else the file ``scalerun launch
    --deepspeed-config`` named for every rank. Both, naming different files, is an error:
    which one would the run use?"""

    launched = environ.get(variables.DEEPSPEED_CONFIG) or None
    if given is None or launched is None:
        return given if given is not None else launched
    if isinstance(given, Mapping) or Path(given).resolve() != Path(launched).resolve():
        shown = "a dict" if isinstance(given, Mapping) else str(given)
        raise ScalerunError(
            f"wrap(config={shown}) but the launch gave --deepspeed-config {launched} "
            f"(${variables.DEEPSPEED_CONFIG}); keep one of the two"
        )
    return given


def load_config(source: str | Path | Mapping[str, Any] | None) -> dict[str, Any]:
    """The user's DeepSpeed config as a dict, parsed as DeepSpeed parses it (hjson).

    hjson accepts what DeepSpeed accepts: trailing commas, comments; duplicate keys are
    refused, as DeepSpeed refuses them.
    """
    if source is None:
        return {}
    if isinstance(source, Mapping):
        return _plain(source)
    path = Path(source)
    if not path.is_file():
        raise ScalerunError(f"DeepSpeed config {path} does not exist; pass an existing ds_config.json")
    import hjson

    try:
        return _plain(hjson.loads(path.read_text(), object_pairs_hook=_no_duplicates))
    except (hjson.HjsonDecodeError, ValueError) as error:
        raise ScalerunError(f"DeepSpeed config {path} cannot be parsed: {error}") from None


def _plain(value: Any) -> Any:
    """Deep copy into plain dicts and lists, so that filling in never edits the user's."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"duplicate key(s) {', '.join(repeated)}")
    return dict(pairs)


def resolve_batch(
    train_batch: int | None, micro_batch: int | None, accumulation: int | None, world_size: int
) -> tuple[int, int, int]:
    """(train_batch_size, micro-batch per rank, accumulation) consistent with the world size.

    Any two determine the third; all three must agree; a single one is completed with
    accumulation 1. Raises with the numbers when they cannot be made consistent.
    """
    if micro_batch is None and train_batch is None:
        raise ScalerunError(
            "deepspeed needs the per-rank batch size: pass micro_batch_size=<loader batch size> "
            "to wrap() or set train_micro_batch_size_per_gpu in the DeepSpeed config"
        )
    if micro_batch is not None and accumulation is not None:
        total = micro_batch * accumulation * world_size
        if train_batch is not None and train_batch != total:
            raise ScalerunError(
                f"train_batch_size={train_batch} but micro-batch {micro_batch} x accumulation "
                f"{accumulation} x {world_size} ranks = {total}; drop train_batch_size or fix one of them"
            )
        return total, micro_batch, accumulation
    assert train_batch is not None or micro_batch is not None
    if train_batch is None:
        return micro_batch * world_size, micro_batch, 1  # type: ignore[operator]
    known = micro_batch if micro_batch is not None else accumulation or 1
    per_known, rest = divmod(train_batch, known * world_size)
    if rest or per_known < 1:
        raise ScalerunError(
            f"train_batch_size={train_batch} is not a multiple of {known * world_size} "
            f"({known} x {world_size} ranks); use a train_batch_size divisible by it"
        )
    if micro_batch is not None:
        return train_batch, micro_batch, per_known
    return train_batch, per_known, accumulation or 1


def _agree(config: dict, key: str, value: Any, option: str) -> None:
    """Set ``config[key]`` from a wrap() option, refusing to contradict the user's file."""
    if value is None:
        return
    if key in config and config[key] != value:
        raise ScalerunError(
            f"wrap({option}) says {value!r} but the DeepSpeed config has {key}={config[key]!r}; "
            "remove one of the two"
        )
    config[key] = value


def build_config(
    user: dict[str, Any],
    settings: TrainSettings,
    options: DeepSpeedOptions,
    *,
    world_size: int,
    on_cpu: bool,
    client_optimizer: bool,
) -> dict[str, Any]:
    """The config handed to ``deepspeed.initialize``: the user's, completed and checked."""
    config = _plain(user)
    _set_zero_stage(config, options.zero_stage)
    _set_batch(config, settings, world_size)
    _set_precision(config, settings.precision)
    _agree(config, "gradient_clipping", settings.clip_grad_norm, "clip_grad_norm")
    # DeepSpeed clips at 1.0 unless told otherwise; the other strategies do not clip
    # unless asked, and a run switched to DeepSpeed should train the same.
    config.setdefault("gradient_clipping", 0.0)
    _set_optimizer(config, client_optimizer=client_optimizer, on_cpu=on_cpu)
    return config


def _set_zero_stage(config: dict, stage: int | None) -> None:
    zero = config.setdefault("zero_optimization", {})
    if stage is not None and stage not in (0, 1, 2, 3):
        raise ScalerunError(f"zero_stage={stage} is not a ZeRO stage; use 0, 1, 2 or 3")
    if stage is not None and "stage" in zero and zero["stage"] != stage:
        raise ScalerunError(
            f"wrap(zero_stage={stage}) but the DeepSpeed config says stage {zero['stage']}; remove one"
        )
    zero.setdefault("stage", DEFAULT_ZERO_STAGE if stage is None else stage)


def _set_batch(config: dict, settings: TrainSettings, world_size: int) -> None:
    micro = config.get("train_micro_batch_size_per_gpu")
    if settings.micro_batch_size is not None and micro not in (None, settings.micro_batch_size):
        raise ScalerunError(
            f"wrap(micro_batch_size={settings.micro_batch_size}) but the DeepSpeed config has "
            f"train_micro_batch_size_per_gpu={micro}; remove one"
        )
    accumulation = config.get("gradient_accumulation_steps")
    if settings.accumulation is not None and accumulation not in (None, settings.accumulation):
        raise ScalerunError(
            f"wrap(accumulation={settings.accumulation}) but the DeepSpeed config has "
            f"gradient_accumulation_steps={accumulation}; remove one"
        )
    total, micro, steps = resolve_batch(
        config.get("train_batch_size"),
        micro if micro is not None else settings.micro_batch_size,
        accumulation if accumulation is not None else settings.accumulation,
        world_size,
    )
    config.update(train_batch_size=total, train_micro_batch_size_per_gpu=micro,
                  gradient_accumulation_steps=steps)


def _set_precision(config: dict, precision: str | None) -> None:
    enabled = [name for name in ("bf16", "fp16") if config.get(name, {}).get("enabled")]
    if len(enabled) > 1:
        raise ScalerunError("the DeepSpeed config enables both bf16 and fp16; keep one")
    if precision is None:
        return
    wanted = [] if precision == "fp32" else [precision]
    if enabled and enabled != wanted:
        raise ScalerunError(
            f"wrap(precision={precision!r}) but the DeepSpeed config enables {enabled[0]}; remove one"
        )
    if wanted:
        config.setdefault(precision, {})["enabled"] = True


def _set_optimizer(config: dict, *, client_optimizer: bool, on_cpu: bool) -> None:
    section = config.get("optimizer")
    if client_optimizer and section is not None:
        raise ScalerunError(
            "an optimizer was passed to wrap() and the DeepSpeed config has an \"optimizer\" "
            "section; keep one of the two"
        )
    if not client_optimizer and section is None:
        raise ScalerunError(
            "deepspeed needs an optimizer: pass optimizer= to wrap() or add an \"optimizer\" "
            "section to the DeepSpeed config"
        )
    if client_optimizer:
        # The user chose this optimizer on purpose; DeepSpeed only asks for consent.
        config.setdefault("zero_allow_untested_optimizer", True)
    elif on_cpu and str(section.get("type", "")).lower() in ("adam", "adamw"):
        # DeepSpeed's FusedAdam needs a GPU compiler; torch's Adam runs anywhere.
        section.setdefault("params", {}).setdefault("torch_adam", True)
