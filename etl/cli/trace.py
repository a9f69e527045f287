"""`etl trace`: which samples a training run read at a step, and when it read a sample, from a
loader state it saved (NOTE [ a run's history ] in `loaders.order.history`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from etl.cli.app import app, err, out
from etl.cli.progress import BarProgress
from etl.errors import ConfigError, described, redacted
from etl.storage.location import StoreUrl, as_location


@app.command()
def trace(
    record: Annotated[
        Path,
        typer.Argument(
            help="A checkpoint (torch.save, Lightning, accelerate, a transformers "
            "checkpoint folder) or a JSON file holding a loader's state_dict()."
        ),
    ],
    step: Annotated[int | None, typer.Option("--step", min=0, help="A global step.")] = None,
    rank: Annotated[int, typer.Option("--rank", min=0, help="The rank asked about.")] = 0,
    sample: Annotated[
        str | None, typer.Option("--sample", help="A sample id or source name: when was it read?")
    ] = None,
    sheet: Annotated[
        Path | None, typer.Option("--sheet", help="With --step: a contact sheet of its samples.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
    allow_store: Annotated[
        bool,
        typer.Option(
            "--allow-store",
            help="Open a dataset in object storage that the state's record names (requests "
            "go there with your credentials); without it such a state is refused.",
        ),
    ] = False,
    max_epochs: Annotated[
        int, typer.Option("--max-epochs", min=1, help="With --sample: epochs drawn at most.")
    ] = 100_000,
) -> None:
    """Say which samples a run read at a step (--step), with each one's crop where the run
    cropped in its workers, or at which steps and ranks it read a sample (--sample), from a
    loader state it saved: the dataset and order are opened again from the state's record,
    nothing of the training code is needed.

    Example:  etl trace checkpoints/last.ckpt --step 41237 --rank 3
    """
    if (step is None) == (sample is None):
        raise typer.BadParameter("give --step N or --sample ID_OR_SOURCE")
    if sheet is not None and step is None:
        raise typer.BadParameter("--sheet draws the samples of a --step")
    tools = _tracing()
    state = _loader_state(record)
    _check_datasets(record, tools.datasets_named(state), allow_store)
    try:
        run = _Run(tools.rebuilt(state), state)
        if step is not None:
            answer = run.at_step(step, rank, tools.samples_at, tools.crops_at)
        else:
            assert sample is not None
            steps_of = partial(tools.steps_of, max_epochs=max_epochs)
            answer = run.reads_of(sample, steps_of, BarProgress(enabled=not as_json))
    except ValueError as exc:
        raise ConfigError(f"{record}: {exc}") from None
    _given(answer, state, sheet, step, as_json)


def _given(
    answer: dict[str, Any],
    state: Mapping[str, Any],
    sheet: Path | None,
    step: int | None,
    as_json: bool,
) -> None:
    """The answer drawn (--sheet) and printed, as JSON or for a reader."""
    if sheet is not None:
        _draw(state, answer["samples"], sheet, step)
        answer["sheet"] = str(sheet)
    if as_json:
        print(json.dumps(answer, indent=2))
    else:
        _print_answer(answer, sheet)


def _tracing() -> Any:
    """`loaders.loader.trace`, or ConfigError naming what to install."""
    try:
        import loaders.loader.trace as tools
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"etl trace opens the run with the loaders ({exc.name} is missing): "
            "pip install 'etl-memmap[loaders]'"
        ) from None
    return tools


def _check_datasets(record: Path, datasets: list[str], allow_store: bool) -> None:
    """Say which datasets the state's record opens (stderr); ConfigError for one in object
    storage without --allow-store: a state file is someone's word, and opening its URL sends
    requests, signed with the user's credentials (NOTE [ no request nobody asked for ])."""
    for dataset in datasets:
        shown = redacted(dataset)
        if isinstance(as_location(dataset), StoreUrl) and not allow_store:
            raise ConfigError(
                f"{record}: its run record names the dataset {shown!r} in object storage; "
                "etl trace opens it only with --allow-store"
            )
        err.print(f"opening {shown} (as {record.name} records it)", highlight=False)


class _Run:
    """A run opened again from its state: the two questions `etl trace` answers of it."""

    def __init__(self, loader: Any, state: Mapping[str, Any]) -> None:
        self.loader, self.state = loader, state
        self.table = loader.dataset.manifest_rows(list(range(len(loader.dataset))))
        self.versions = _versions(state)

    def at_step(self, step: int, rank: int, samples_at: Any, crops_at: Any) -> dict[str, Any]:
        """--step: the samples that rank read there, named, with their crops if recorded."""
        indices = samples_at(self.loader, self.state, step, rank).tolist()
        crops = crops_at(self.loader, self.state, step, indices)
        return {
            "step": step,
            "rank": rank,
            "samples": _named(self.table, indices, self.versions),
            "crops": crops if crops is not None else NOT_RECORDED,
        }

    def reads_of(self, sample: str, steps_of: Any, bar: BarProgress) -> dict[str, Any]:
        """--sample: every (step, rank) that read it."""
        indices = _indices_of(self.table, sample)
        found = sorted({at for i in indices for at in steps_of(self.loader, self.state, i, bar)})
        read = [{"step": s, "rank": r} for s, r in found]
        answer: dict[str, Any] = {
            "sample": _named(self.table, indices[:1], self.versions)[0],
            "read": read,
        }
        if len(indices) > 1:  # a source in several members of a mixture: read as any
            answer["indices"] = indices
        return answer


def _print_answer(answer: Mapping[str, Any], sheet: Path | None) -> None:
    """`etl trace`'s answer for a reader: a step's samples (with crops), or a sample's reads."""
    if "step" in answer:
        step, rank = answer["step"], answer["rank"]
        out.print(f"step {step}, rank {rank}: {len(answer['samples'])} samples", highlight=False)
        crops = answer["crops"] if isinstance(answer["crops"], list) else None
        for k, row in enumerate(answer["samples"]):
            line = f"  {row['sample_id']}  {row['class_name']:12} {row['source']}"
            out.print(line + (f"  {_crop_text(crops[k])}" if crops else ""), highlight=False)
        if crops is None:
            out.print(f"  crops: {NOT_RECORDED}", highlight=False)
        if sheet is not None:
            out.print(f"wrote {sheet}", highlight=False)
        return
    row = answer["sample"]
    out.print(f"{row['sample_id']} {row['source']}: read {len(answer['read'])} times",
              highlight=False)  # fmt: skip
    for at in answer["read"]:
        out.print(f"  step {at['step']}, rank {at['rank']}", highlight=False)


NOT_RECORDED = (
    "not recorded: the run cropped on the device (DeviceLoader(augment=...)), or not at all; "
    "crops made in the workers (PackedDataset.with_crop) are"
)


def _crop_text(crop: Mapping[str, Any]) -> str:
    """`box 12,30 180x200 flipped -> 224x224`, or `centre of 256x341 -> 224x224`."""
    size = "x".join(str(v) for v in crop["size"])
    if "resized" in crop:
        return f"centre of {'x'.join(str(v) for v in crop['resized'])} -> {size}"
    top, left, height, width = crop["box"]
    flipped = " flipped" if crop["flip"] else ""
    return f"box {top},{left} {height}x{width}{flipped} -> {size}"


def _loader_state(record: Path) -> Mapping[str, Any]:
    """The loader state in `record`: the first mapping in it with a run's history (in a
    transformers checkpoint folder, its trainer_state.json: `loaders.trainers.hf`)."""
    if record.is_dir() and (record / "trainer_state.json").is_file():
        record = record / "trainer_state.json"
    try:
        if record.suffix == ".json":
            loaded: Any = json.loads(record.read_text())
        else:
            loaded = _torch_load(record)
    except ConfigError:
        raise
    except Exception as exc:
        # (a type weights_only does not allow is an UnpicklingError): one line, never a trace
        raise ConfigError(f"{record}: cannot read it ({described(exc)})") from None
    for found in _mappings(loaded):
        if "history" in found and "step" in found:
            return found
    raise ConfigError(f"{record}: holds no loader state with a run's history")


SAFE_TORCH_LOAD = (2, 6)
"""The first torch whose `torch.load(weights_only=True)` cannot be made to run code by the
file it reads (CVE-2025-32434 bypassed it before): a checkpoint is data, never code."""


def _torch_load(record: Path) -> Any:
    """The checkpoint `record` read by torch with weights only; ConfigError, reading nothing,
    where the installed torch is older than `SAFE_TORCH_LOAD`."""
    import torch

    found = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])
    if found < SAFE_TORCH_LOAD:
        raise ConfigError(
            f"{record}: not read: torch {torch.__version__}'s weights_only=True load can be "
            "made to run code by the file (CVE-2025-32434); install torch>=2.6, or give the "
            "loader state as JSON (json.dump(loader.state_dict(), f))"
        )
    return torch.load(record, map_location="cpu", weights_only=True)


def _mappings(value: Any, depth: int = 0) -> Iterator[Mapping[str, Any]]:
    if depth > 12:
        return
    if isinstance(value, Mapping):
        yield value
        for item in value.values():
            yield from _mappings(item, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _mappings(item, depth + 1)


def _named(table: Any, indices: list[int], versions: list[int]) -> list[dict[str, Any]]:
    """Each index's sample: id, source, class, split, the dataset version it was read from
    (and its member, in a mixture)."""
    names = ["sample_id", "source", "class_name", "split"]
    rows = table.take(indices).select(
        names + (["member"] if "member" in table.column_names else [])
    )
    return [
        {"index": i, **row, "version": versions[row.get("member", 0)]}
        for i, row in zip(indices, rows.to_pylist(), strict=True)
    ]


def _versions(state: Mapping[str, Any]) -> list[int]:
    """The dataset version of the run (of each member, in a mixture), from its record."""
    return [int(r["version"]) for r in _datasets(state)]


def _datasets(state: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """What the run's record says of each dataset it read (each member's, in a mixture; a
    view's base): at least its path or URL, "dataset", and its "version"."""
    run = json.loads(str(state["run"]))
    records = run["mixture"]["members"] if "mixture" in run else [run]
    return [r.get("view", r) for r in records]


def _indices_of(table: Any, sample: str) -> list[int]:
    """Every index of `sample` (an id, else a source): one, or one per mixture member."""
    for column in ("sample_id", "source"):
        found = [i for i, value in enumerate(table.column(column).to_pylist()) if value == sample]
        if found:
            return found
    raise ValueError(f"no sample of the run's selection has the id or source {sample!r}")


def _draw(
    state: Mapping[str, Any], samples: list[dict[str, Any]], sheet: Path, step: int | None
) -> None:
    """A contact sheet of a step's samples, in the order read, as `etl show` draws one: each
    from its dataset (a mixture's member's) at the version the run read."""
    from etl.explore import dataset as explore
    from etl.explore.drawing import Cell, draw_sheet, save_png

    records = _datasets(state)
    opened: dict[int, explore.Dataset] = {}
    cells, seen = [], set()
    for row in samples:
        member = int(row.get("member", 0))
        if (member, row["sample_id"]) in seen:  # a sample read twice in a step: drawn once
            continue
        seen.add((member, row["sample_id"]))
        if member not in opened:
            record = records[member]
            opened[member] = explore.open_dataset(record["dataset"], record["version"])
        caption = (f"{row['class_name']} ({row['split']})", row["sample_id"])
        cells.append(Cell(opened[member].image(row["sample_id"], longest=96), caption))
    title = f"step {step}: {len(cells)} samples"
    save_png(draw_sheet(cells, columns=min(8, len(cells)), cell=96, title=title).image, sheet)
