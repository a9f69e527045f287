"""Train with Ray Train's `TorchTrainer` on 2 workers (CPU, one Ray instance on 127.0.0.1), the
loader given to `ray.train.torch.prepare_data_loader` as make_loader returns it; record what
each rank's steps got. Run by tests/loaders/loader/test_trainers.py.

    python ray_run.py DATA OUT [--workers W] [--dist-sampler 0|1] [--save-at STEP]
        [--resume]

Writes OUT/seen-<rank>.json: per epoch, the sha1 of each image of each step, in order. With
--save-at, each rank also writes its loader's state after that many steps (of the run) to
OUT/state-<rank>.json and goes on; --resume loads it first, so the run goes on from there.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token written to the home folder

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_data_loader
from run_args import run_parser  # beside this script

HERE = str(Path(__file__).parent)


def loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch

    from loaders import PackedDataset, make_loader

    rank = ray.train.get_context().get_world_rank()
    out = Path(config["out"])
    train = PackedDataset.open(config["data"], split="train")
    loader = make_loader(
        train,
        batch_size=4,
        shuffle=True,
        seed=3,
        num_workers=config["workers"],
        workers_as="processes",
    )
    start_epoch = 0
    if config["resume"]:
        state = json.loads((out / f"state-{rank}.json").read_text())
        loader.load_state_dict(state)
        start_epoch = state["epoch"]
    prepared = prepare_data_loader(loader, add_dist_sampler=config["dist"])
    model = torch.nn.Linear(int(torch.tensor(train.sample_shape).prod()), len(train.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: dict[int, list[list[str]]] = {}
    step = 0 if not config["resume"] else loader.state_dict()["step"]
    for epoch in range(start_epoch, config["epochs"]):
        loader.set_epoch(epoch)
        for images, labels in prepared:
            seen.setdefault(epoch, []).append(
                [hashlib.sha1(i.contiguous().numpy().tobytes()).hexdigest() for i in images]
            )
            loss = torch.nn.functional.cross_entropy(model(images.flatten(1) / 255.0), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == config["save_at"]:
                (out / f"state-{rank}.json").write_text(json.dumps(loader.state_dict()))
    final = loader.state_dict()
    (out / f"seen-{rank}.json").write_text(json.dumps({"seen": seen, "state": final}))


def main() -> None:
    parser = run_parser()
    parser.add_argument("--dist-sampler", type=int, default=1)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    a = parser.parse_args()
    ray.init(
        num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([HERE, *sys.path])}},
    )  # fmt: skip
    config = {
        "data": a.data, "out": a.out, "epochs": a.epochs, "workers": a.workers,
        "dist": bool(a.dist_sampler), "save_at": a.save_at, "resume": a.resume,
    }  # fmt: skip
    trainer = TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=str(Path(a.out) / "ray"), name="run"),
    )
    trainer.fit()
    ray.shutdown()


if __name__ == "__main__":
    main()
