"""Compute slowed by the NCCL kernels of collectives that run hidden behind it.

A hidden collective is not free: NCCL runs it as one CTA per channel, each resident on its own SM for the
whole collective, so the GEMMs and attention it overlaps run on ``sm_count - channels`` SMs meanwhile. Over
``hidden_s`` seconds of overlapped communication the concurrent compute therefore loses
``hidden_s x channels / sm_count`` seconds of full-GPU work, which the step pays later. Priced only for GPUs
with a known ``GPUSpec.sm_count`` (never the CPU trial device, whose collectives are synchronous).
"""

from __future__ import annotations

from autotune.specs import ClusterSpec

__all__ = ["NCCL_OVERLAP_CTAS", "hidden_comm_sm_s"]

NCCL_OVERLAP_CTAS = 16
"""SMs an NCCL collective holds while it runs beside compute: one CTA per channel (NCCL
src/enqueue.cc launches ``nChannels`` blocks; each channel's ring/tree/NVLS work runs in one block). NCCL's
NVLS default is 16 channels (src/transport/nvls.cc ``NCCL_PARAM(NvlsChannels, "NVLS_NCHANNELS", 16)``);
an H100 FSDP-style ``ncclAllGather`` overlapped with a GEMM was profiled launching 24 blocks (NVIDIA
developer forum, "Compute-Communication Overlap Causes Severe GEMM Performance Degradation because of
Tail Effect", 2025, Nsight Systems on 132 SMs); DeepSeek-V3 reserves 20 of the H800's 132 SMs for its
overlapped communication (DeepSeek-AI 2024, Sec. 3.2.2). The lower figure is taken: the wave-quantisation
tail that report also shows (GEMM time nearly doubled) is not priced."""


def hidden_comm_sm_s(cluster: ClusterSpec, hidden_s: float) -> float:
    """Extra compute seconds from ``hidden_s`` seconds of NCCL communication overlapped with compute; 0 on a
    GPU without ``sm_count`` or with too few SMs to spare the channels."""
    sms = cluster.gpu.sm_count
    if not sms or sms <= NCCL_OVERLAP_CTAS or hidden_s <= 0:
        return 0.0
    return hidden_s * NCCL_OVERLAP_CTAS / sms
