"""What the per-image stages need of a validated config, as plain frozen dataclasses.

The config is validated once, in the `etl` process (`etl.config`, pydantic). A pack worker is
sent this recipe instead: it unpickles without importing pydantic or the config models, so a
worker starts with what decoding needs and nothing more (#60: 0.34 s of imports before its
first photo, against 0.07 s for numpy, Pillow and libjpeg-turbo). Each step carries the fields
of its stage model that the stages read, under the same names; `recipe_of` copies them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from etl.config import DecodeStage, PipelineConfig, Stage

Color: TypeAlias = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """`etl.config.DecodeStage`, as the decode reads it."""

    mode: str
    background: Color
    max_pixels: int
    multi_frame: str
    formats: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ResizeStep:
    """`etl.config.ResizeStage`, as the resize reads it."""

    size: tuple[int, int] | None
    mode: str
    filter: str
    fill: Color
    draft: bool | None
    shorter: int | None
    longer: int | None
    upscale: bool

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The stored (height, width) of a (height, width) image: `size`, or for 'keep_aspect'
        the shorter side scaled to `shorter` (no larger unless `upscale`), then the longer side
        capped at `longer`; each side rounded to the nearest pixel (half to even), at least 1.
        Exact arithmetic: the side that was aimed at is exactly `shorter` or `longer`."""
        if self.mode != "keep_aspect":
            assert self.size is not None
            return self.size
        assert self.shorter is not None and self.longer is not None
        scale = Fraction(self.shorter, min(height, width))
        if not self.upscale:
            scale = min(scale, Fraction(1))
        if max(height, width) * scale > self.longer:
            scale = Fraction(self.longer, max(height, width))
        return max(1, round(height * scale)), max(1, round(width * scale))


@dataclass(frozen=True, slots=True)
class ValidateStep:
    """`etl.config.ValidateStage`, as a worker checks a source (duplicates are the plan's)."""

    min_size: tuple[int, int] | None
    max_aspect: float | None


@dataclass(frozen=True, slots=True)
class CallStep:
    """`etl.config.CallStage`: the user's function, imported by name in the worker."""

    function: str
    options: dict[str, Any]


Step: TypeAlias = ResizeStep | ValidateStep | CallStep


@dataclass(frozen=True, slots=True)
class Recipe:
    """Encoded bytes -> one stored sample's pixels: the decode, the stages after it in order,
    and the shape the output takes."""

    decode: DecodeStep
    steps: tuple[Step, ...]
    reducing_gap: float
    """`PipelineConfig.reducing_gap`: how much larger than the output a reduced JPEG decode
    stays."""
    layout: str
    sample_shape: tuple[int, int, int]
    ragged: bool
    """Samples keep their aspect ratio, each its own size within `resize`'s sides."""
    channels: int
    resize: ResizeStep
    """The pipeline's resize step (the one `steps` holds)."""

    @property
    def functions(self) -> tuple[str, ...]:
        """The user functions the call steps name, in order."""
        return tuple(step.function for step in self.steps if isinstance(step, CallStep))


_STEPS: dict[str, type[Any]] = {"resize": ResizeStep, "validate": ValidateStep, "call": CallStep}


def _plain(step_class: type[Any], stage: Any) -> Any:
    """The step of a validated stage model: its fields of the same names, copied."""
    return step_class(**{f.name: getattr(stage, f.name) for f in fields(step_class)})


def decode_step(stage: DecodeStage) -> DecodeStep:
    """The decode step of a validated decode stage (for a decode outside a run)."""
    step: DecodeStep = _plain(DecodeStep, stage)
    return step


def step_of(stage: Stage) -> Step:
    """The step of a validated stage after the decode (a decode stage is `decode_step`'s)."""
    step: Step = _plain(_STEPS[stage.kind], stage)
    return step


def recipe_of(config: PipelineConfig) -> Recipe:
    """The recipe of a validated config (its stages after the decode, in order)."""
    steps = tuple(step_of(stage) for stage in config.stages[1:])
    return Recipe(
        decode=decode_step(config.decode),
        steps=steps,
        reducing_gap=config.reducing_gap,
        layout=config.output.layout,
        sample_shape=config.sample_shape,
        ragged=config.ragged,
        channels=config.channels,
        resize=next(step for step in steps if isinstance(step, ResizeStep)),
    )
