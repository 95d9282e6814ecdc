"""WeightAveraging: the update against an AdamW step on the same shard, its memory, and the whole
step's overhead at ``update_every`` 1 and 10, beside trl's ``BEMACallback`` and the update Lightning's
``EMAWeightAveraging`` makes (``torch.optim.swa_utils.AveragedModel.update_parameters`` with
``get_ema_multi_avg_fn``). Not part of the test suite.

1. **Update / optimizer step** on one shard (the trainable fp32 tensors of a Llama from a config:
   ``--hidden``, ``--layers``, ``--vocab``): the median time of ``torch.optim.AdamW(foreach=True).step()``
   and, on the same tensors, of our update (``LocalAverage.update``: EMA, one ``_foreach_lerp_``;
   BEMA, a lerp and four foreach passes), of trl's ``BEMACallback._update_bema_weights`` (its
   own code, on the same tensors, its buffers on the same device) and of ``AveragedModel``'s EMA
   update. Printed as ratios to the AdamW step (the goal: EMA <= 0.5).
2. **Memory**: our buffers' bytes on this rank against ``4 * P / W`` (one process: W = 1; the
   per-rank figures under the engines come from ``tests/callbacks/test_weight_averaging_sharded.py``).
3. **Whole step**: a stock ``Trainer`` trains the same Llama ``--steps`` steps (sequences of
   ``--seq`` random tokens, ``--batch`` per step), no evaluation, in rounds: without callback,
   ``WeightAveraging(update_every=1 / 10, evaluate_on="raw")``, trl's ``BEMACallback(update_freq=1
   / 10)``; the seconds per step of each against the run without, median over ``--rounds``.

``python benchmarks/bench_weight_averaging.py [--hidden 512] [--layers 4] [--steps 30] [--rounds 3]
[--device cpu] [--threads 1] [--skip-trainer]``; ``--quick`` for tiny sizes (the code path only).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any, Callable

import torch


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="the parameters' dtype (the average is fp32)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a "
                        "shared machine)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-trainer", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.vocab, args.steps, args.rounds, args.repeats = 64, 2, 500, 6, 1, 3
    return args


def llama(args: argparse.Namespace) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                         num_key_value_heads=max(1, args.hidden // 64), max_position_embeddings=args.seq)
    return LlamaForCausalLM(config).to(device=args.device, dtype=getattr(torch, args.dtype))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_seconds(function: Callable[[], Any], repeats: int, device: str) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        function()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def update_costs(args: argparse.Namespace) -> dict[str, float]:
    """Seconds of an AdamW step and of each update, on the same tensors."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    from trl.trainer.callbacks import BEMACallback

    from hf_callbacks_plus.callbacks.weight_averaging import BEMA, EMA
    from hf_callbacks_plus.callbacks.weight_averaging.shard import LocalAverage

    model = llama(args)
    parameters = [p for p in model.parameters() if p.requires_grad]
    for parameter in parameters:
        parameter.grad = torch.randn_like(parameter) * 1e-3
    optimizer = torch.optim.AdamW(parameters, lr=1e-4, foreach=True)
    costs = {"parameters": float(sum(p.numel() for p in parameters))}
    costs["adamw_step"] = median_seconds(optimizer.step, args.repeats, args.device)
    for name, rule in (("ema", EMA(0.999)), ("bema", BEMA())):
        average = LocalAverage(rule)
        average.attach(model, None)
        average.reset()
        costs[f"ours_{name}"] = median_seconds(lambda average=average: average.update(100), args.repeats,
                                               args.device)
        costs[f"ours_{name}_bytes"] = float(average.nbytes)
    trl = BEMACallback(device=args.device)  # its own update, on the same tensors
    trl.thetat_params = parameters
    trl.theta0_params = [p.detach().clone() for p in parameters]
    trl.ema_params = [p.detach().clone() for p in parameters]
    trl.running_model = torch.nn.ParameterList([torch.nn.Parameter(p.detach().clone()) for p in parameters])
    costs["trl_bema"] = median_seconds(lambda: torch.no_grad()(trl._update_bema_weights)(100), args.repeats,
                                       args.device)
    averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    costs["averaged_model_ema"] = median_seconds(lambda: averaged.update_parameters(model), args.repeats,
                                                 args.device)
    return costs


def whole_step(args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per step of ``train()`` for each variant, and the baseline's."""
    from transformers import PrinterCallback, Trainer, TrainingArguments
    from trl.trainer.callbacks import BEMACallback

    from hf_callbacks_plus.callbacks.weight_averaging import WeightAveraging
    from hf_callbacks_plus.integrations.ordering import run_before_integrations

    generator = torch.Generator().manual_seed(0)
    rows = [{"input_ids": ids, "labels": ids} for ids in
            torch.randint(0, args.vocab, (args.batch * args.steps, args.seq), generator=generator)]
    variants: dict[str, Callable[[], list]] = {
        "without": lambda: [],
        "ours_every_1": lambda: [WeightAveraging(update_every=1, evaluate_on="raw")],
        "ours_every_10": lambda: [WeightAveraging(update_every=10, evaluate_on="raw")],
        "trl_bema_every_1": lambda: [BEMACallback(update_freq=1, device=args.device)],
        "trl_bema_every_10": lambda: [BEMACallback(update_freq=10, device=args.device)],
    }
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds + 1):  # the first round warms up (imports, allocator), not counted
        for name, callbacks in variants.items():
            with tempfile.TemporaryDirectory() as folder:
                training = TrainingArguments(output_dir=folder, max_steps=args.steps,
                                             per_device_train_batch_size=args.batch,
                                             report_to="none", disable_tqdm=True, save_strategy="no",
                                             logging_steps=args.steps, use_cpu=args.device == "cpu",
                                             learning_rate=1e-4, seed=0, dataloader_num_workers=0)
                trainer = Trainer(model=llama(args), args=training, train_dataset=rows, callbacks=callbacks())
                trainer.remove_callback(PrinterCallback)
                run_before_integrations(trainer)
                start = time.perf_counter()
                trainer.train()
                sync(args.device)
                if round_:
                    seconds[name].append((time.perf_counter() - start) / args.steps)
    return {name: statistics.median(values) for name, values in seconds.items()}


def lightning_step(args: argparse.Namespace) -> dict[str, float]:
    """Lightning's own loop on the same Llama: seconds per step without and with its
    ``EMAWeightAveraging`` (updated after every optimizer step), median over ``--rounds``; empty
    without ``lightning`` (it is no dependency of ours: run this script with a Python that has it)."""
    try:
        import lightning as L
        from lightning.pytorch.callbacks import EMAWeightAveraging
    except ImportError:
        return {}

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch * args.steps, args.seq), generator=generator)
    loader = torch.utils.data.DataLoader(ids, batch_size=args.batch)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = llama(args)

        def training_step(self, batch: Any, index: int) -> Any:
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    seconds: dict[str, list[float]] = {"lightning_without": [], "lightning_ema": []}
    for round_ in range(args.rounds + 1):  # the first round warms up, not counted
        for name in seconds:
            callbacks = [EMAWeightAveraging(decay=0.999)] if name == "lightning_ema" else []
            trainer = L.Trainer(max_steps=args.steps, accelerator=args.device.split(":")[0], devices=1,
                                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, callbacks=callbacks)
            module = Module()
            start = time.perf_counter()
            trainer.fit(module, loader)
            sync(args.device)
            if round_:
                seconds[name].append((time.perf_counter() - start) / args.steps)
    return {name: statistics.median(values) for name, values in seconds.items()}


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    costs = update_costs(args)
    step = costs["adamw_step"]
    params = int(costs["parameters"])
    print(f"shard: {params:,} trainable parameters ({args.dtype} on {args.device}); AdamW step "
          f"{step * 1e3:.2f} ms (median of {args.repeats})")
    for name in ("ours_ema", "ours_bema", "trl_bema", "averaged_model_ema"):
        print(f"  {name:<20} {costs[name] * 1e3:8.2f} ms  = {costs[name] / step:.2f} x the AdamW step")
    for name, buffers in (("ema", 1), ("bema", 3)):
        got = int(costs[f"ours_{name}_bytes"])
        print(f"  memory {name}: {got:,} bytes = {got / (4 * params):.2f} x 4*P/W (W=1), {buffers} fp32 "
              "buffer(s)")
    if args.skip_trainer:
        return
    per_step = whole_step(args)
    base = per_step["without"]
    print(f"whole step (stock Trainer, {args.steps} steps x {args.rounds} rounds, median): without "
          f"{base * 1e3:.1f} ms/step")
    for name, value in per_step.items():
        if name != "without":
            print(f"  {name:<20} {value * 1e3:8.1f} ms/step = {value / base:.3f} x without")
    lightning = lightning_step(args)
    if lightning:
        base = lightning["lightning_without"]
        print(f"Lightning's loop: without {base * 1e3:.1f} ms/step; EMAWeightAveraging "
              f"{lightning['lightning_ema'] * 1e3:.1f} ms/step = {lightning['lightning_ema'] / base:.3f} "
              "x without")
    else:
        print("Lightning's loop: not measured (lightning is not installed in this Python)")


if __name__ == "__main__":
    main()
