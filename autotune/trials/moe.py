"""The Mixture-of-Experts layer of the trial workload, and its expert-parallel token dispatch.

``MoE`` replaces a block's MLP on the layers ``ModelSpec.moe_layers`` names: a top-k softmax router
(``num_experts``, ``experts_per_token``; the k weights renormalised to sum to one, as Mixtral's softmax over
its top-k logits and Qwen3-MoE's ``norm_topk_prob`` do), ``num_experts`` SwiGLU experts of width
``expert_ffn_hidden_size`` stored as ``[experts, in, out]`` tensors (torchtitan ``GroupedExperts``), and a
shared expert of width ``shared_ffn_hidden_size`` that every token visits (DeepSeek, Qwen2-MoE without its
sigmoid gate). No capacity factor: no token is dropped, so any layout computes the same function.

Expert parallelism (``apply_ep``) keeps ``num_experts / ep`` experts on each rank of an EP group and moves
tokens all-to-all, as torchtitan's ``ExpertParallel._token_dispatch`` / ``_token_combine``
(torchtitan/distributed/expert_parallel.py) and Megatron-Core's ``MoEAlltoAllTokenDispatcher``
(megatron/core/transformer/moe/token_dispatcher.py) do: tokens sorted by expert, per-expert counts exchanged
first (``all_to_all_single`` on the counts) to size the splits, the tokens exchanged, regrouped from
``[source rank][local expert]`` to ``[local expert][source rank]``, run, and sent back by the reverse
exchange; the gate weights are applied after the combine. The exchange is an autograd ``Function`` whose
backward is the reverse all-to-all with the splits swapped.

Only torch is imported: this module runs on GPU machines without optuna or deepspeed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from autotune.specs import ModelSpec

__all__ = ["Router", "GroupedExperts", "MoE", "apply_ep", "load_balancing_loss"]


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; backward sends the gradients back the way they came."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``scale`` in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


class _AuxLossScaler(torch.autograd.Function):
    """Adds ``d aux / d router`` to the backward of ``x`` without changing the model's output or the reported
    loss (Megatron-Core ``moe_utils.py`` ``MoEAuxLossAutoScaler``): the aux loss's gradient is 1 per
    micro-batch (Megatron scales it by 1 / micro-batches; trials run without it: ``aux_loss_coef`` 0)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(aux)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (aux,) = ctx.saved_tensors
        return grad, torch.ones_like(aux)


def load_balancing_loss(probs: torch.Tensor, counts: torch.Tensor, top_k: int) -> torch.Tensor:
    """Switch Transformer's balance loss (Fedus et al. 2021 eq. 4), as Megatron-Core's
    ``switch_load_balancing_loss_func``: ``E / (T^2 k) x sum_i (tokens to i) x (router mass on i)``; 1 when
    the routing is uniform. ``probs``: ``[T, E]`` softmax; ``counts``: tokens routed to each expert."""
    tokens, experts = probs.shape
    return (probs.sum(0) * counts.to(probs.dtype)).sum() * experts / (tokens * tokens * top_k)


class Router(nn.Module):
    """Top-k softmax gating (Shazeer et al. 2017): the ``k`` best experts of each token and their weights."""

    def __init__(self, hidden: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, num_experts, bias=False)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(weights [T, k], experts [T, k], probs [T, E])``; softmax in fp32."""
        probs = F.softmax(self.gate(tokens).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        return weights / weights.sum(-1, keepdim=True), experts, probs


class GroupedExperts(nn.Module):
    """This rank's experts as ``[experts, in, out]`` tensors, run one after another over their contiguous
    token groups (torchtitan ``GroupedExperts`` without ``grouped_mm``: on the CPU trial device a loop)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        e, h, f = spec.num_experts, spec.hidden_size, spec.expert_ffn_hidden_size
        self.gated = spec.gated_mlp
        self.gate_proj = nn.Parameter(torch.empty(e, h, f)) if self.gated else None
        self.up_proj = nn.Parameter(torch.empty(e, h, f))
        self.down_proj = nn.Parameter(torch.empty(e, f, h))
        self.grad_scale = 1.0
        """Set by ``apply_ep`` to ``1 / ep``: see ``apply_ep``."""

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        weights = [w for w in (self.gate_proj, self.up_proj, self.down_proj) if w is not None]
        if self.grad_scale != 1.0:
            weights = [_ScaleGrad.apply(w, self.grad_scale) for w in weights]
        *inner, down = weights
        outs = []
        for e, chunk in enumerate(x.split(counts)):
            if self.gated:
                mid = F.silu(chunk @ inner[0][e]) * (chunk @ inner[1][e])
            else:
                mid = F.gelu(chunk @ inner[0][e], approximate="tanh")
            outs.append(mid @ down[e])
        return torch.cat(outs)


class MoE(nn.Module):
    """Router, routed experts (local or expert-parallel) and an optional shared expert, in place of an MLP."""

    def __init__(self, spec: ModelSpec, shared: nn.Module | None, aux_loss_coef: float = 0.0) -> None:
        super().__init__()
        self.num_experts, self.top_k = spec.num_experts, spec.experts_per_token
        self.router = Router(spec.hidden_size, spec.num_experts, spec.experts_per_token)
        self.experts = GroupedExperts(spec)
        self.shared_expert = shared
        self.aux_loss_coef = aux_loss_coef
        self.ep_group: dist.ProcessGroup | None = None
        self.ep = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, experts, probs = self.router(tokens)
        flat = experts.reshape(-1)
        order = flat.argsort(stable=True)  # the T x k token copies, grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts)
        source = order // self.top_k
        routed = tokens[source]
        if self.ep_group is None:
            out = self.experts(routed, counts.tolist())
        else:
            out = self._expert_parallel(routed, counts)
        out = out * weights.reshape(-1)[order, None].to(out.dtype)
        y = tokens.new_zeros(tokens.shape, dtype=out.dtype).index_add(0, source, out)  # autocast: out is bf16
        if self.shared_expert is not None:
            y = y + self.shared_expert(tokens)
        if self.aux_loss_coef and self.training and torch.is_grad_enabled():
            y = _AuxLossScaler.apply(y, self.aux_loss_coef * load_balancing_loss(probs, counts, self.top_k))
        return y.view_as(x)

    def _expert_parallel(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Send ``routed`` (grouped by global expert, ``counts`` each) to the experts' ranks, run the local
        experts, and return their outputs in the same order (module docstring)."""
        ep, local = self.ep, self.num_experts // self.ep
        with torch.no_grad():
            received = torch.empty_like(counts)
            dist.all_to_all_single(received, counts, group=self.ep_group)
        in_splits = counts.view(ep, local).sum(1).tolist()
        per_source = received.view(ep, local)  # [source rank, local expert]
        out_splits = per_source.sum(1).tolist()
        x = _AllToAll.apply(routed, out_splits, in_splits, self.ep_group)
        regroup = _regroup_index(per_source)
        y = self.experts(x[regroup], per_source.sum(0).tolist())
        y = y[regroup.argsort()]
        return _AllToAll.apply(y, in_splits, out_splits, self.ep_group)


def _regroup_index(per_source: torch.Tensor) -> torch.Tensor:
    """Row order that turns tokens laid out ``[source][local expert]`` into ``[local expert][source]``."""
    sizes = per_source.reshape(-1)
    starts = (sizes.cumsum(0) - sizes).view_as(per_source).t().reshape(-1)  # where each group begins now
    sizes = per_source.t().reshape(-1)
    offsets = sizes.cumsum(0) - sizes  # where it begins after the regroup
    total = int(sizes.sum())
    return torch.arange(total, device=sizes.device) + (starts - offsets).repeat_interleave(
        sizes, output_size=total
    )


@torch.no_grad()
def apply_ep(model: nn.Module, *, group: dist.ProcessGroup, ep: int, rank: int) -> None:
    """Keep experts ``[rank E/ep, (rank+1) E/ep)`` of every MoE layer and dispatch over ``group``.

    Expert gradients: rank ``r``'s expert gradient sums the contributions of every EP peer's tokens, and its
    expert-data-parallel peers (the ranks holding the same experts, ``dp / ep`` of them) average it. The batch
    mean needs the sum over all ``dp`` ranks divided by ``dp``, i.e. that average divided by ``ep``: the
    experts scale their gradient by ``1 / ep``. torchtitan reaches the same by dividing expert gradients by
    the whole DP degree (``parallel_dims.py`` ``fsdp_gradient_divide_factor``); a scale in autograd avoids
    FSDP's ``PREMUL_SUM`` reduction, which gloo lacks.
    """
    for module in model.modules():
        if not isinstance(module, MoE):
            continue
        experts = module.experts
        per_rank = module.num_experts // ep
        keep = slice(rank * per_rank, (rank + 1) * per_rank)
        for name, p in list(experts.named_parameters(recurse=False)):
            setattr(experts, name, nn.Parameter(p[keep].clone(), requires_grad=p.requires_grad))
        experts.grad_scale = 1.0 / ep
        module.ep_group, module.ep = group, ep
