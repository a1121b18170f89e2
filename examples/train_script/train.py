"""Your own training script, measured by ``autotune search --script examples/train_script/train.py``.

A plain PyTorch script (DDP-style replication or FSDP2, optional activation checkpointing; DeepSpeed ZeRO
from ``AUTOTUNE_DS_CONFIG`` for plans priced for DeepSpeed) that reads the plan autotune wants measured and
reports its throughput through ``autotune.contract``. It implements data parallelism only, so pin the rest::

    autotune search --model tiny --gpus 2 --gpu cpu --device cpu --backend torchrun \\
        --script examples/train_script/train.py --tp 1 --pp 1 --trials 3 --global-batch 8 --seq-len 64

The contract in four calls: ``contract.plan()`` (what to run), ``contract.warmup_steps()`` /
``contract.measure_steps()`` (how long), ``contract.step(seconds)`` after each measured step, and
``contract.report(...)`` once at the end (rank 0 writes; other ranks' calls are no-ops). The launch files of
``autotune emit`` (``best/``) set the same variables: ``bash best/launch_torchrun.sh train.py`` runs it too.
"""

from __future__ import annotations

import gc
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from autotune import contract

VOCAB, WIDTH, HEADS, LAYERS = 1024, 128, 4, 4


class LM(nn.Module):
    def __init__(self, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.zeros(seq_len, WIDTH))
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(LAYERS)
        )
        self.head = nn.Linear(WIDTH, VOCAB)
        self.mask = nn.Transformer.generate_square_subsequent_mask(seq_len)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos
        for layer in self.layers:
            h = layer(h, src_mask=self.mask.to(h.device), is_causal=True)
        return self.head(h)


def parallelize(model: LM, plan: dict, device: torch.device) -> None:
    """The plan's recompute, then its sharding: FSDP2 per layer and the root, or replication."""
    for i, layer in enumerate(model.layers):
        if plan["recompute"] == "full":
            model.layers[i] = checkpoint_wrapper(layer)
        elif plan["recompute"] == "selective":
            layer.self_attn = checkpoint_wrapper(layer.self_attn)
    dtype = torch.bfloat16 if device.type == "cuda" and plan["precision"] == "bf16" else None
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    if plan["sharding"] == "hsdp":
        shard = plan["hsdp_shard_size"]
        mesh = init_device_mesh(device.type, (plan["dp"] // shard, shard), mesh_dim_names=("rep", "shard"))
    else:
        mesh = init_device_mesh(device.type, (plan["dp"],))
    if plan["sharding"] == "none":  # DDP-style: every rank holds everything, gradients all-reduced
        from torch.distributed._composable.replicate_with_fsdp import replicate as wrap

        kwargs: dict = {"mesh": mesh, "mp_policy": mp}
    else:
        wrap = fully_shard
        kwargs = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": plan["sharding"] != "fsdp-grad-op"}
        if plan["offload"] and device.type == "cuda":  # optimizer states (and the step) on the host
            from torch.distributed.fsdp import CPUOffloadPolicy

            kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in model.layers:
        wrap(layer, **kwargs)
    wrap(model, **kwargs)


def deepspeed_engine(model: LM) -> nn.Module:
    """ZeRO (stage, precision, batch, clipping) as ``ds_config.json`` says; the engine accumulates itself."""
    import deepspeed

    config = os.environ[contract.ENV["ds_config"]]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def main() -> None:
    plan = contract.plan()
    if (plan["tp"], plan["pp"], plan["cp"]) != (1, 1, 1) or plan["framework"] not in ("fsdp", "deepspeed"):
        raise ValueError(
            "this example runs data parallelism with FSDP2 or DeepSpeed ZeRO only: pin --tp 1 --pp 1 --cp 1"
        )
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = LM(plan["seq_len"]).to(device)
    engine = deepspeed_engine(model) if plan["framework"] == "deepspeed" else None
    optimizer = None
    if engine is None:
        parallelize(model, plan, device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rows, accum = plan["micro_batch"], plan["grad_accum"]
    for step in range(contract.warmup_steps() + contract.measure_steps()):
        start = time.perf_counter()
        for _ in range(accum):
            tokens = torch.randint(VOCAB, (rows, plan["seq_len"] + 1), device=device)
            logits = (engine or model)(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
            if engine is not None:  # DeepSpeed scales by the accumulation and steps at its boundary
                engine.backward(loss)
                engine.step()
            else:
                (loss / accum).backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if use_cuda:
            torch.cuda.synchronize(device)
        if step >= contract.warmup_steps():
            contract.step(time.perf_counter() - start)
    peak = (
        torch.cuda.max_memory_allocated(device)
        if use_cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )  # CPU: the process's peak RSS
    peak_t = torch.tensor([float(peak)], device=device)
    dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
    contract.report(peak_memory_bytes=peak_t.item(), loss=loss.item())
    # Nothing may still hold the process group when it is destroyed, or gloo can abort at exit ("terminate
    # called without an active exception"): barrier, drop the model, optimizer and engine, collect, destroy.
    dist.barrier()
    del model, optimizer, engine
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
