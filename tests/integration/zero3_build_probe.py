"""Run under torchrun by test_train.py: builds the training engine with a spy on
``deepspeed.initialize`` and writes, per rank, whether the model it received was already
ZeRO-3 partitioned (every parameter a DeepSpeed parameter holding no full tensor on this rank)
and how many parameter elements this rank held then. Usage: ``zero3_build_probe.py SPEC OUT_DIR``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from engines.train import engine as train_engine
from engines.train.dist import import_deepspeed, init_process
from engines.train.spec import WorkerSpec

deepspeed = import_deepspeed()  # as a rank imports it (without the MLflow client)


def main(spec_path: str, out_dir: str) -> int:
    rank = init_process()
    seen: dict[str, object] = {}
    real_initialize = deepspeed.initialize

    def spy(*args: object, model: object, **kwargs: object) -> object:
        params = list(model.parameters())  # type: ignore[attr-defined]
        seen["partitioned"] = all(hasattr(p, "ds_id") and p.numel() == 0 for p in params)
        seen["local_elements"] = sum(p.numel() for p in params)
        seen["full_elements"] = sum(int(getattr(p, "ds_numel", p.numel())) for p in params)
        return real_initialize(*args, model=model, **kwargs)

    deepspeed.initialize = spy
    engine, _ = train_engine.build_engine(WorkerSpec.from_json(spec_path), world_size=int(os.environ["WORLD_SIZE"]))
    seen["trained_elements"] = sum(int(getattr(p, "ds_numel", p.numel())) for p in engine.module.parameters())
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(seen))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
