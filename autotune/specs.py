"""The nouns the cost model reads: a model's shape and a cluster's hardware.

Both are frozen data. They are built from data files by ``autotune.catalog`` (presets, Hugging Face
``config.json``, cluster YAML); nothing here reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from autotune.definition import Definition
from autotune.hostprofile import NO_HOST_TIME, HostProfile

__all__ = ["ModelSpec", "GPUSpec", "LinkSpec", "ClusterSpec"]

GIB = 1024**3


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, dense or Mixture-of-Experts, with GQA or multi-head latent attention (MLA),
    some layers Gated DeltaNet (Qwen3-Next), or a hybrid Mamba-2 pattern (Nemotron-H, 3). Fields after
    ``bias`` default to a dense GQA model; the parameter arithmetic is ``autotune.modelshape``'s."""

    name: str
    """Preset name or the path it was read from."""
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    """Key/value heads: equal to ``num_heads`` for MHA, fewer for GQA, 1 for MQA."""
    ffn_hidden_size: int  # of a dense layer (an MoE model's dense layers)
    vocab_size: int
    max_seq_len: int
    tie_embeddings: bool = False
    gated_mlp: bool = True
    """SwiGLU/GeGLU MLP with three matrices (Llama, Gemma); False for a plain two-matrix GELU MLP (GPT)."""
    learned_positions: bool = False
    """GPT-style learned position embeddings (``max_seq_len x hidden`` extra parameters)."""
    bias: bool = False
    """Linear layers carry biases (GPT-2/3); Llama has none."""
    attention_head_dim: int | None = None
    """Width of one attention head when it is not ``hidden / heads`` (HF ``head_dim``: Gemma, Qwen3)."""
    attention_bias: bool = False
    """Q/K/V projections carry biases (Qwen2, gpt-oss); counted as parameters only."""
    num_layer_norms: int = 2
    """Norms per block (4 in Gemma 2: pre/post attention and MLP)."""
    attention_window: int | None = None
    """Keys a local-attention layer sees: its sliding window (Mistral, Gemma 2) or chunk (Llama 4)."""
    num_local_layers: int = 0
    """Layers that attend within ``attention_window``; the others attend to the whole sequence."""
    chunked_attention: bool = False
    """Local layers attend within fixed chunks (Llama 4 ``attention_chunk_size``), not a sliding window."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0: a dense model."""
    experts_per_token: int = 0
    """Routed experts each token visits (top-k)."""
    expert_ffn_hidden_size: int = 0
    """MLP width of one routed expert."""
    shared_ffn_hidden_size: int = 0
    """Total MLP width of the shared experts every token visits in an MoE layer (0: none)."""
    moe_layers: tuple[int, ...] = ()
    """Indices of the MoE layers (the others are dense); the catalog lists them for every MoE model."""
    expert_bias: bool = False
    """Experts and router carry biases (gpt-oss)."""
    moe_latent_size: int = 0
    """LatentMoE (Nemotron 3 Super / Ultra; megatron-core ``moe_layer.py``): routed experts and their dispatch
    at this width, behind two ``h x latent`` projections ``fc1/fc2_latent_proj`` (0: none)."""
    q_lora_rank: int = 0
    """MLA: rank of the query down-projection (0: queries projected directly)."""
    kv_lora_rank: int = 0
    """MLA: rank of the joint key/value latent (0: no MLA, plain GQA)."""
    qk_rope_head_dim: int = 0
    """MLA: per-head query/key width carrying RoPE (its key part is shared by all heads)."""
    qk_nope_head_dim: int = 0
    """MLA: per-head query/key width without RoPE, and (``v_head_dim``) value width."""
    v_head_dim: int = 0
    num_linear_layers: int = 0
    """Layers whose token mixer is Gated DeltaNet linear attention (Yang et al., ICLR 2025; Qwen3-Next,
    Qwen3.5 / 3.6), the others softmax attention; ``modelshape`` prices each kind per layer and takes the mean
    over blocks, as for ``num_local_layers``."""
    linear_key_heads: int = 0
    """Gated DeltaNet: key (and query) heads, ``linear_num_key_heads``."""
    linear_value_heads: int = 0
    """Gated DeltaNet: value heads, ``linear_num_value_heads`` (queries and keys are repeated to them)."""
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    """Gated DeltaNet: width of the depthwise causal convolution over Q, K and V."""
    attention_output_gate: bool = False
    """Softmax attention's output gated by the sigmoid of a second query-wide projection (Qwen3-Next)."""
    layer_pattern: str = ""
    """Megatron's ``hybrid_override_pattern`` (Nemotron-H / 3), one single-sub-layer layer per character:
    ``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE ("": blocks of a token mixer and an MLP)."""
    mamba_heads: int = 0
    """Mamba-2 (Dao & Gu, ICML 2024) SSD heads (d_inner = heads x head_dim); state N, B/C groups, conv."""
    mamba_head_dim: int = 0
    mamba_state_dim: int = 0
    mamba_groups: int = 0
    mamba_conv_kernel: int = 0
    mtp_layers: int = 0
    """Multi-token prediction depths (DeepSeek-V3 Sec. 2.2; ``--mtp-num-layers``) on the last stage, each a
    block behind two norms and an ``eh_proj`` (2h -> h) with a head pass and loss (``costmodel.mtp``)."""
    mtp_pattern: str = ""
    """A hybrid model's MTP block in ``layer_pattern`` characters (Nemotron 3: ``*E``); "": one mean block."""
    mtp_shared: bool = False
    """One MTP module run at every depth (Megatron ``mtp_use_repeated_layer``): its parameters count once."""
    definition: Definition = Definition()
    """RoPE, norms, activation (``autotune.definition``): nothing a step prices; they define the model."""

    def __post_init__(self) -> None:
        if not isinstance(self.moe_layers, tuple):  # JSON round trips (scaleout, trials) give lists
            object.__setattr__(self, "moe_layers", tuple(self.moe_layers))
        if isinstance(self.definition, dict):
            object.__setattr__(self, "definition", Definition(**self.definition))

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_heads

    @property
    def kv_hidden_size(self) -> int:
        """Width of K (and of V): ``num_kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim

    @property
    def num_mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_width(self) -> int:
        """Width of the tokens routed experts take and the dispatch moves: ``h``, or LatentMoE's latent."""
        return self.moe_latent_size or self.hidden_size

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def linear_share(self) -> float:
        """Share of the blocks whose token mixer is Gated DeltaNet (0 without such layers)."""
        return self.num_linear_layers / self.num_layers

    @property
    def mamba_share(self) -> float:
        """Share of the layers whose token mixer is Mamba-2 (``layer_pattern``'s ``M``)."""
        return self.layer_pattern.count("M") / self.num_layers if self.layer_pattern else 0.0

    @property
    def softmax_share(self) -> float:
        """Share of the blocks whose token mixer is softmax attention (a hybrid pattern's ``*`` share)."""
        if self.layer_pattern:
            return self.layer_pattern.count("*") / self.num_layers
        return 1.0 - self.linear_share

    @property
    def num_dense_mlp_layers(self) -> int:
        """Layers with a dense MLP: all but the MoE layers of a transformer, a pattern's ``-``."""
        if self.layer_pattern:
            return self.layer_pattern.count("-")
        return self.num_layers - len(self.moe_layers)

    @property
    def sublayers_per_layer(self) -> int:
        """Sub-layers of a layer, each with a norm, a residual add and a TP reduction: 2, a pattern's 1."""
        return 1 if self.layer_pattern else 2

    @cached_property
    def params_per_layer(self) -> float:
        """Parameters of one transformer block, the mean over the blocks of an MoE model (Narayanan et al.
        2021 Sec. 5.1: 12h^2 + 13h for GPT; generalised to GQA, MLA, gated MLPs and experts in
        ``modelshape.block_params``)."""
        from autotune.modelshape import block_params_sum

        q, r = divmod(block_params_sum(self), self.num_layers)
        return q if not r else block_params_sum(self) / self.num_layers

    @cached_property
    def expert_params_per_layer(self) -> float:
        """Routed-expert parameters of a block, the mean over blocks (0 for dense models): the part expert
        parallelism splits instead of TP."""
        from autotune.modelshape import routed_expert_params

        return routed_expert_params(self) * len(self.moe_layers) / self.num_layers

    @cached_property
    def embedding_params(self) -> int:
        """Input embedding (+ learned positions) and the output projection if untied."""
        emb = self.vocab_size * self.hidden_size
        pos = self.max_seq_len * self.hidden_size if self.learned_positions else 0
        out = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return emb + pos + out

    @cached_property
    def num_params(self) -> int:
        """Total parameters, final norm included."""
        from autotune.modelshape import block_params_sum

        final_norm = self.hidden_size * (2 if self.bias else 1)
        return block_params_sum(self) + self.embedding_params + final_norm

    @property
    def total_params(self) -> int:
        return self.num_params

    @cached_property
    def active_params(self) -> int:
        """Parameters one token passes through: all but the routed experts it does not visit (Mixtral's
        "12.9B active"; DeepSeek-V3's "37B activated")."""
        from autotune.modelshape import routed_expert_params

        idle = self.num_experts - self.experts_per_token
        each = routed_expert_params(self) // max(1, self.num_experts)
        return self.num_params - len(self.moe_layers) * idle * each

    @cached_property
    def mtp_params(self) -> int:
        """Parameters of the multi-token prediction modules (``modelshape.mtp_module_params`` each; not in
        ``num_params``); one module when ``mtp_shared``."""
        from autotune.modelshape import mtp_module_params

        return (min(1, self.mtp_layers) if self.mtp_shared else self.mtp_layers) * mtp_module_params(self)

    @cached_property
    def num_non_embedding_params(self) -> int:
        return self.num_params - self.embedding_params


@dataclass(frozen=True, kw_only=True, slots=True)
class GPUSpec:
    """One accelerator type from ``data/hardware.yaml`` (or a probe profile)."""

    key: str
    """Catalog key, e.g. ``h100-sxm``."""
    name: str
    bf16_flops: float | None
    """Dense peak FLOP/s in bf16 (None: unsupported). Likewise the next three."""
    fp16_flops: float | None
    fp8_flops: float | None
    fp32_flops: float | None
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    gemm_efficiency: float
    """Fraction of the dense peak that large GEMMs reach (calibratable)."""
    intra_node_link: str
    default_gpus_per_node: int
    default_inter_node_link: str
    default_nics_per_node: int
    sources: tuple[str, ...] = ()
    host: HostProfile = NO_HOST_TIME
    """Host time the device does not hide (``autotune.hostprofile``): measured on the CPU trial device, none
    on GPUs."""
    async_collectives: bool = True
    """Whether the frameworks run DP/TP collectives beside compute on this device. FSDP2 and DeepSpeed issue
    them on side streams (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_reduce``: a
    blocking ``dist.all_reduce`` inside ``device_handle.stream(...)``); a CPU has no streams, so there every
    collective blocks the rank's compute and none overlaps (the CPU trial device: false)."""
    half_bytes: int = 2
    """Bytes a 16-bit (bf16/fp16) tensor of a plan takes on this device: 4 on the CPU trial device, which runs
    bf16 plans in fp32 (trials/train.py ``compute_dtype``), so its activations, gathered weights and 16-bit
    gradients move twice the bytes through its collectives."""
    gemm_shape_curve: tuple[tuple[float, float], ...] = ()
    """GEMM efficiency by shape, as multiples of ``gemm_efficiency``: points ``(arithmetic intensity,
    factor)`` with intensity ``m n k / (m k + k n + m n)`` (FLOPs per 16-bit operand byte), interpolated in
    log intensity (``costmodel.kernels.gemm_efficiency``). Empty: every shape runs at ``gemm_efficiency``."""
    fp8_gemm_scale: float = 1.0
    """fp8 GEMM efficiency (of the fp8 peak) as a multiple of the 16-bit one at the intensity an fp8 GEMM of
    that shape sits at on ``gemm_shape_curve`` (``fp8_intensity_factor``)."""
    attention_curves: tuple[
        tuple[str, tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]], ...
    ] = ()
    """Per attention kernel (``cudnn``, ``fa2``, ``fa3``): forward and backward fraction of the 16-bit peak
    by key length, points ``(seq, fraction)`` at head dim 128 (``costmodel.kernels.attention_rates``).
    Empty: the attention core runs at ``gemm_efficiency`` with ``compute.FLASH_BWD_SLOWDOWN``."""
    attention_head_dim: tuple[tuple[str, int, int, float, float], ...] = ()
    """Per attention kernel: (kernel, q/k head dim, v head dim, forward, backward) rate as a multiple of its
    head-dim-128 curve (``attention_curves``), measured pairs; other head dims interpolated in ``log2``
    (``costmodel.kernels.head_dim_factor``). Empty, or a kernel not listed: every head dim at the 128
    curve."""
    tdp_w: float | None = None
    """Board power the peaks and efficiencies above hold at (None: not stated)."""
    power_limit_w: float | None = None
    """Board power limit the cards run at, if below ``tdp_w``: compute slows by ``kernels.clock_factor``."""
    sm_count: int | None = None
    """Streaming multiprocessors (None: not stated): Transformer Engine's comm+GEMM overlap takes some of them
    from the GEMMs it overlaps (``compute.ub_sm_margin_s``)."""
    compute_capability: float | None = None
    """CUDA compute capability (None: not stated or not NVIDIA): below 9.0 there is no CUDA multicast, which
    Transformer Engine's comm+GEMM overlap needs unless told ``UB_SKIPMC=1`` (``emit.megatron``)."""
    nvlink_domain_gpus: int | None = None
    """GPUs that share one NVLink domain when larger than a node (GB200 NVL72: 72 GPUs over 18 trays of 4,
    one NVLink Switch fabric); None: the node is the domain."""
    host_link_bytes_per_s: float | None = None
    """Host<->device copy bandwidth per GPU and direction when all GPUs of a node copy (None: the PCIe figure,
    ``costmodel.offload.PCIE_BYTES_PER_S``); offload traffic runs at it (``costmodel.actoffload``)."""
    fp8_intensity_factor: float | None = None
    """Where on ``gemm_shape_curve`` an fp8 GEMM sits. None: where its operand bytes put it against the
    doubled peak (``costmodel.kernels.fp8_intensity``: 1-byte inputs, 16-bit output); a number: that fraction
    of the 16-bit intensity, 1.0 where fp8 was measured at its 16-bit fraction at the same shape (Blackwell:
    benchmarks/results/blackwell_gemm_curve.md)."""

    def peak_flops(self, precision: str) -> float | None:
        """Dense peak FLOP/s for ``bf16 | fp16 | fp8 | fp32``; None where the GPU lacks the format."""
        return {
            "bf16": self.bf16_flops,
            "fp16": self.fp16_flops,
            "fp8": self.fp8_flops,
            "fp32": self.fp32_flops,
        }[precision]

    def supports(self, precision: str) -> bool:
        return self.peak_flops(precision) is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkSpec:
    """A point-to-point link: bandwidth per direction and a per-message latency (alpha-beta model)."""

    key: str
    bw_bytes_per_s: float
    latency_s: float
    sources: tuple[str, ...] = ()
    ring_hop_s: float | None = None
    """NCCL's per-hop latency of a ring over this link (``costmodel.comm.NCCL_RING_BASE_S``); None where the
    collectives are not NCCL's (gloo over shared memory or TCP), which pay ``latency_s`` per ring step."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """``num_nodes x gpus_per_node`` GPUs of one type.

    Inside a node every GPU reaches every other over ``intra_link`` (NVSwitch or PCIe switch, so a ring
    inside a node runs at the per-GPU link bandwidth). Between nodes each node has ``nics_per_node`` NICs
    of ``inter_link``; a GPU's share is ``nics_per_node * bw / gpus_per_node``.
    """

    name: str
    gpu: GPUSpec
    num_nodes: int
    gpus_per_node: int
    intra_link: LinkSpec
    inter_link: LinkSpec
    nics_per_node: int
    host_memory_bytes_per_node: int = 1024 * GIB
    """Host RAM per node (for optimizer offload); DGX A100/H100 nodes have 1-2 TiB."""
    collective_efficiency: float = 0.85
    """Fraction of link bandwidth a large NCCL collective reaches (nccl-tests busbw / link peak;
    ~0.8-0.9 on NVSwitch and IB). Calibratable."""
    dp_overlap_fraction: float | None = None
    """Share of the compute window that DP/ZeRO/FSDP collectives hide behind (None: the documented
    ``costmodel.overlap.DP_OVERLAP_FRACTION``). Calibratable."""
    step_overhead_s: float = 0.0
    """Fixed seconds per optimizer step that no kernel term covers (framework bookkeeping, host-side
    dispatch). 0 in the catalog; fitted from trials (``autotune calibrate``)."""
    microbatch_overhead_s: float = 0.0
    """Fixed seconds per micro-batch (forward + backward dispatch, hooks). 0 in the catalog; fitted."""
    shared_core_latency: float = 0.0
    """Share (0-1) of a ring step's latency that queues behind the other groups of the same axis when the
    ranks of a node share fewer CPU cores than there are ranks (``cores_per_node``; CPU trials;
    ``comm.group_link``). 0 (catalog; a device per rank): the groups of one axis run their rings
    independently, as NCCL's do; 1: the steps of the node's ``G`` groups run one after another, a ring step
    costs ``G`` alphas. Fitted from trials (``autotune calibrate``); a probe runs one world-sized group and
    cannot see it."""
    collective_scales: tuple[tuple[str, float, float], ...] = ()
    """Per collective measured by ``autotune probe`` (``all_gather``, ``reduce_scatter``): its
    own ring latency and bus bandwidth inside a node as multiples of the all-reduce's, which sets
    ``intra_link`` (``costmodel.comm``). Empty: every collective runs at the link's numbers."""
    cores_per_node: int | None = None
    """CPU cores the ranks of a node share when the "GPU" is a CPU rank (CPU trials, ``autotune probe``);
    None: a device per rank. Fewer cores than ranks: ``pipeline.shared_core_bubble_fraction``."""
    profile: str | None = None
    """Where the numbers above came from when not the catalog: a probe profile and/or a calibration,
    e.g. ``profile: cpu-2rank (measured 2026-11-30)``."""
    nvlink_domain_gpus: int | None = None
    """GPUs one ``intra_link`` fabric joins when it spans several nodes (GB200 NVL72: 72, 18 trays of 4 on
    NVLink Switches); None: each node is its own domain. Collectives pick their link by domain, not by node
    (``nvlink_domain``); NICs and host memory stay per node."""

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def nvlink_domain(self) -> int:
        """GPUs of this job that share one NVLink domain: the node, or with ``nvlink_domain_gpus`` the largest
        whole number of nodes up to it that divides the job evenly (ranks fill domains equally: 256 GPUs on
        NVL72 racks run 64 per rack, 144 run 72)."""
        per_node, domain = self.gpus_per_node, self.nvlink_domain_gpus
        if domain is None or domain <= per_node:
            return per_node
        return max(d for d in range(per_node, domain + 1, per_node) if self.num_gpus % d == 0)

    @property
    def inter_node_bw_per_gpu_bytes_per_s(self) -> float:
        return self.nics_per_node * self.inter_link.bw_bytes_per_s / self.gpus_per_node
