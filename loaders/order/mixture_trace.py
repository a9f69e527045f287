"""What a run's history needs of a mixture to draw its orders again (NOTE [ tracing a mixture ]).

NOTE [ tracing a mixture ]: a mixture's order is a pure function of its members' sizes, its
schedule, its seed and the anchor of its last resume (NOTE [ resuming a mixture ]); a resume
may bring other weights, a new schedule or appended members. So each entry of a run's history
that began under a new mixture context (`context_of`: anchor, schedule, sizes, samples per
epoch, replacement) records it, keyed by the entry's global step, in the state's "mixtures"
field; `mixture_order_of` makes that entry's order again from it, whatever mixture the tracing
loader was built with. The weights are written as Python writes floats (`repr`, exact both ways)
and used as written, never normalised again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from loaders.order.mixture_orders import Anchor, MixtureOrder


def context_of(sampler: Any) -> str:
    """The mixture context of a `MixtureSampler` as it stands (JSON, sorted keys)."""
    mix = sampler.mix
    anchor = mix.anchor
    return json.dumps(
        {
            "anchor": [anchor.epoch, anchor.position, [int(c) for c in anchor.cursors]],
            "schedule": [
                [int(first), [float(w) for w in weights]] for first, weights in mix.schedule
            ],
            "sizes": list(mix.sizes),
            "per_epoch": mix.per_epoch,
            "replacement": mix.replacement,
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def mixture_order_of(context: str, seed: int, step_size: int) -> MixtureOrder:
    """The mixture order of an entry recorded with `context`, for global batches of
    `step_size` positions. ValueError naming the field for a context that is not one."""
    try:
        found = json.loads(context)
        epoch, position, cursors = found["anchor"]
        schedule = tuple(
            (int(first), np.asarray(weights, dtype=np.float64))
            for first, weights in found["schedule"]
        )
        sizes, per_epoch = [int(s) for s in found["sizes"]], int(found["per_epoch"])
        if not 0 < per_epoch <= MAX_PER_EPOCH or not 0 < len(sizes) <= MAX_MEMBERS:
            raise ValueError(f"{per_epoch} samples an epoch of {len(sizes)} members")
        order = MixtureOrder(
            sizes, schedule, per_epoch, step_size, seed, bool(found["replacement"])
        )
        order.anchor = Anchor(int(epoch), int(position), tuple(int(c) for c in cursors))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"loader state field 'mixtures' is damaged ({exc!r})") from None
    return order


def encode(contexts: Mapping[int, str]) -> str:
    """The state's "mixtures" field: {step: context} as JSON."""
    return json.dumps({str(k): json.loads(v) for k, v in sorted(contexts.items())}, sort_keys=True)


def decode(text: object) -> dict[int, str]:
    """{step: context} of a state's "mixtures" field (empty for none); ValueError if damaged."""
    if text in (None, ""):
        return {}
    try:
        assert isinstance(text, str) and len(text) <= MIXTURES_BYTES
        found = json.loads(text)
        assert isinstance(found, dict) and len(found) <= MAX_CONTEXTS
        return {
            int(k): json.dumps(v, sort_keys=True, separators=(",", ":")) for k, v in found.items()
        }
    except (AssertionError, TypeError, ValueError, RecursionError):
        raise ValueError("loader state field 'mixtures' is damaged: not a run's mixtures") from None


MAX_CONTEXTS = 4096
"""Contexts a state's "mixtures" field may hold: one per history entry at most (the history's
own limit, `loaders.order.history.HISTORY_LIMIT`, which imports this module)."""
MIXTURES_BYTES = 4 << 20
"""The most a state's "mixtures" field may hold (one context per history entry at most)."""
MAX_PER_EPOCH = 1 << 32
"""The most samples a traced mixture's epoch may declare: its order is drawn whole."""
MAX_MEMBERS = 1 << 16
