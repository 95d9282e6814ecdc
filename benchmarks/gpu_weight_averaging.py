"""One GPU: WeightAveraging's update against the optimizer step on the same shard, with bf16
parameters (the fp32 average beside them) and under FSDP2 (``fully_shard`` on a 1-rank group: the
parameters are DTensors and the average follows their local shards), and the whole step's overhead
at ``update_every`` 1 and 10 beside trl's ``BEMACallback`` and Lightning's ``EMAWeightAveraging``.
Not part of the test suite (nothing there needs a GPU).

It runs ``benchmarks/bench_weight_averaging.py`` on the device with GPU-sized defaults (a Llama of
``--hidden 2048 --layers 8``, bf16 parameters), then the FSDP2 measurement: the median of
``AdamW(foreach=True).step()`` over the DTensor parameters against our update
(``LocalAverage.update`` over this rank's ``to_local()`` shards, found by
``runtime.engines.local_tensors``), synchronising the device around each.

Run on a GPU machine: ``python benchmarks/gpu_weight_averaging.py [--hidden 2048] [--layers 8]``.
Smoke check on CPU (tiny sizes, gloo; the code path only):
``python benchmarks/gpu_weight_averaging.py --cpu``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_weight_averaging as bench  # noqa: E402
import torch  # noqa: E402


def fsdp2_update_against_step(args: argparse.Namespace) -> dict[str, float]:
    """Seconds of an AdamW step over FSDP2's DTensors and of our update over their local shards."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from hf_callbacks_plus.callbacks.weight_averaging import EMA
    from hf_callbacks_plus.callbacks.weight_averaging.shard import LocalAverage

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    if not dist.is_initialized():
        dist.init_process_group("gloo" if args.device == "cpu" else "nccl", rank=0, world_size=1)
    model = bench.llama(args)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    parameters = [p for p in model.parameters() if p.requires_grad]
    for parameter in parameters:
        parameter.grad = torch.randn_like(parameter) * 1e-3
    optimizer = torch.optim.AdamW(parameters, lr=1e-4, foreach=True)
    average = LocalAverage(EMA(0.999))
    shards = average.attach(model, optimizer)
    average.reset()
    costs = {"shard_parameters": float(sum(t.numel() for t in shards.values())),
             "adamw_step": bench.median_seconds(optimizer.step, args.repeats, args.device),
             "ours_ema": bench.median_seconds(lambda: average.update(100), args.repeats, args.device),
             "bytes": float(average.nbytes)}
    dist.destroy_process_group()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on CPU: the code path only")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    known, rest = parser.parse_known_args()
    if known.cpu:
        argv = ["--quick", "--device", "cpu", *rest]
    else:
        argv = ["--hidden", str(known.hidden), "--layers", str(known.layers), "--vocab", "32000",
                "--seq", "512", "--device", "cuda", "--dtype", "bfloat16", *rest]
    print(f"device: {torch.cuda.get_device_name() if torch.cuda.is_available() and not known.cpu else 'cpu'}")
    bench.main(argv)
    args = bench.parse(argv)
    costs = fsdp2_update_against_step(args)
    print(f"FSDP2 (1 rank): {int(costs['shard_parameters']):,} parameters in the local shards; AdamW step "
          f"{costs['adamw_step'] * 1e3:.2f} ms; our EMA update {costs['ours_ema'] * 1e3:.2f} ms = "
          f"{costs['ours_ema'] / costs['adamw_step']:.2f} x the step; {int(costs['bytes']):,} bytes "
          f"= {costs['bytes'] / (4 * costs['shard_parameters']):.2f} x 4*P/W")


if __name__ == "__main__":
    main()
