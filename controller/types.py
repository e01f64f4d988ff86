"""The values that flow through one reconcile pass.

Owns the plain, immutable data shapes shared by every stage: ElasticModel,
Profile, GpuSlot, Pool, Decision, Pending, InputError. The loader builds the inputs,
the planner returns decisions, compose and status read them. No stage adds a
field anywhere else.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from contract.footprint import Terms, link_bytes_per_prefill_token
from controller.placement import EVERYWHERE, Placement
from controller.policy import OFF, Rightsizing

Mode = Literal["resident", "swap", "elastic", "refused"]
DEFAULT_COMPOSITION = "default"
DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True)
class Source:
    """Where a document came from: repo-relative file and 0-based document index."""

    file: str
    document: int = 0


@dataclass(frozen=True)
class SLO:
    context_tokens: int = 4096
    concurrency: int = 1
    ttft_ms: float | None = None
    tpot_ms: float | None = None


@dataclass(frozen=True)
class ElasticModel:
    name: str
    namespace: str
    model: str
    budget_bytes: int
    slo: SLO = SLO()
    gpu_product: str | None = None
    composition: str = DEFAULT_COMPOSITION
    revision: str = "main"
    generation: int = 1
    has_slo: bool = False
    source: Source | None = field(default=None, compare=False)
    served_names: tuple[str, ...] = ()  # spec.servedNames: aliases the worker also serves it under
    rightsizing: Rightsizing = field(default=OFF, compare=False)  # how the budget follows usage; never planned on
    user_budget_bytes: int | None = field(default=None, compare=False)  # spec.memoryBudget when right-sizing Auto set budget_bytes
    rightsizing_conditions: tuple[dict, ...] = field(default=(), compare=False)  # the loop's last conditions (its record)
    rightsizing_recommendation: dict | None = field(default=None, compare=False)  # its record's open recommendation
    weight_dtype: str = "auto"  # spec.weights.dtype, canonical (contract.precision): auto, bfloat16, float16, int8, int4
    placement: Placement = field(default=EVERYWHERE, compare=False)  # spec.placement: the clusters that run it
    # the document it was parsed from, kept in a repository with clusters/ only: rendered for the clusters it selects
    document: dict | None = field(default=None, compare=False, repr=False)

    @property
    def spec_budget_bytes(self) -> int:
        """The budget the user wrote (budget_bytes may be right-sizing Auto's effective budget)."""
        return self.budget_bytes if self.user_budget_bytes is None else self.user_budget_bytes

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def profile_key(self, gpu_product: str) -> tuple[str, str, str, str]:
        """The Profile.key this model is planned by on `gpu_product`."""
        return (self.model, self.revision, gpu_product, self.weight_dtype)


@dataclass(frozen=True)
class Profile:
    """One model on one GPU product (schemas/profile.schema.json, flattened)."""

    model: str
    gpu_product: str
    dtype: str
    source: str
    method: str
    embedding_bytes: int
    layer_bytes: tuple[int, ...]
    final_norm_bytes: int
    head_bytes: int
    tied_embeddings: bool
    kv_bytes_per_token: int
    prefill_activation_bytes_per_token: int
    prefill_chunk_tokens: int
    decode_activation_bytes_per_sequence: int
    runtime_overhead_bytes: int
    decode_ms_per_token: float
    prefill_ms_per_1k_tokens: float
    host_to_device_gbps: float
    revision: str = "main"
    decode_step_ms: tuple[tuple[int, float], ...] = ()  # measured (batch, ms per step), sorted by batch
    file: str | None = field(default=None, compare=False)
    weight_dtype: str = "auto"  # weights.dtype: the spec.weights.dtype it was made for (auto: the checkpoint's own)

    @property
    def estimated(self) -> bool:
        """Computed from the architecture and datasheets, not measured on the GPU."""
        return self.source == "estimated"

    @property
    def total_layers(self) -> int:
        return len(self.layer_bytes)

    @property
    def weight_bytes(self) -> int:
        return self.embedding_bytes + sum(self.layer_bytes) + self.final_norm_bytes + self.head_bytes

    @cached_property
    def terms(self) -> Terms:
        """The footprint terms this profile gives (contract.footprint): what plan and worker size it by."""
        return Terms(fixed_bytes=self.embedding_bytes + self.final_norm_bytes + self.head_bytes,
                     layer_bytes=self.layer_bytes, kv_bytes_per_token=self.kv_bytes_per_token,
                     prefill_activation_bytes_per_token=self.prefill_activation_bytes_per_token,
                     decode_activation_bytes_per_sequence=self.decode_activation_bytes_per_sequence,
                     overhead_bytes=self.runtime_overhead_bytes,
                     stream_bytes_per_prefill_token=link_bytes_per_prefill_token(
                         self.host_to_device_gbps, self.prefill_ms_per_1k_tokens))

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What a profile measures: one model revision on one GPU product in one weight dtype."""
        return (self.model, self.revision, self.gpu_product, self.weight_dtype)

    @property
    def stored_dtype(self) -> str:
        """What the decoder linears are stored in: int8, int4, or the compute dtype."""
        return self.weight_dtype if self.weight_dtype in ("int8", "int4") else self.dtype


@dataclass(frozen=True)
class Pool:
    """A node pool of gpus.yaml (`pools:`): nodes an autoscaler (Karpenter, the cluster autoscaler) adds when a
    pending worker Pod selects them, every one alike. The planner names its nodes `pool-<name>-<k>`
    (`node_name`), k from 0 to maxNodes - 1; the first `min_nodes` are kept whatever the plan (paid for)."""

    name: str
    product: str
    memory_bytes: int
    gpus_per_node: int
    host_memory_bytes: int | None
    min_nodes: int
    max_nodes: int
    selector: tuple[str, str]  # the label (key, value) every node of the pool carries, e.g. karpenter.sh/nodepool
    reserved_bytes: int = 1 << 30

    def node_name(self, ordinal: int) -> str:
        return f"{POOL_NODE_PREFIX}{self.name}-{ordinal}"

    def ordinal(self, node: str) -> int | None:
        """k of its node `pool-<name>-<k>`; None for any other node name."""
        digits = node.removeprefix(f"{POOL_NODE_PREFIX}{self.name}-")
        return int(digits) if digits != node and digits.isdigit() and self.node_name(int(digits)) == node else None

    def slots(self, ordinal: int) -> tuple[GpuSlot, ...]:
        """The GPUs of its node `ordinal`, as the planner plans them."""
        return tuple(GpuSlot(node=self.node_name(ordinal), index=i, product=self.product,
                             memory_bytes=self.memory_bytes, reserved_bytes=self.reserved_bytes,
                             host_memory_bytes=self.host_memory_bytes, pool=self) for i in range(self.gpus_per_node))


POOL_NODE_PREFIX = "pool-"


@dataclass(frozen=True)
class GpuSlot:
    """One GPU of one node: the unit a worker owns."""

    node: str
    index: int
    product: str
    memory_bytes: int
    reserved_bytes: int = 1 << 30
    host_memory_bytes: int | None = None  # the node's host RAM for pods (shared by its GPUs); None: not planned
    device_uuid: str | None = None  # the GPU its worker was given (from the worker's verdicts); None: not known yet
    pool: Pool | None = field(default=None, repr=False)  # a pool node's GPU (its node is the plan's name for it)

    @property
    def id(self) -> str:
        return f"{self.node}/gpu{self.index}"

    @property
    def usable_bytes(self) -> int:
        return max(0, self.memory_bytes - self.reserved_bytes)


@dataclass(frozen=True)
class Predicted:
    """A model's predicted latencies in its mode and slice. `ttft_ms`, `tpot_ms`: "all busy", with every
    co-tenant decoding at once, the link shared and a swap group's turns waited (the SLO verdict's figures);
    `alone_*`: the same mode and slice with no co-tenant busy (None in a decision written before they existed)."""

    ttft_ms: float
    tpot_ms: float
    swap_in_ms: float | None = None
    link_share_gbps: float | None = None  # the host→device bandwidth this model streams at (elastic, swap)
    alone_ttft_ms: float | None = None
    alone_tpot_ms: float | None = None


@dataclass(frozen=True)
class Decision:
    """The planner's verdict for one ElasticModel (status.assigned)."""

    name: str
    namespace: str
    model: str
    gpu_product: str | None
    slot: str | None
    mode: Mode
    resident_layers: int
    total_layers: int
    need_bytes: int
    budget_bytes: int
    footprint_bytes: int
    predicted: Predicted | None
    slo_met: bool | None
    reason: str
    reason_code: str
    profile: str | None = None
    estimated: bool = False  # the predictions come from an estimated (not measured) profile
    host_bytes: int = 0  # pinned host RAM on the slot's node: a swap member's weights, an elastic model's streamed layers
    # What the worker is told to admit with (its config's dtype and footprint); set by the planner from the
    # profile, absent in decisions read back from git. Not part of the decision's identity.
    dtype: str | None = field(default=None, compare=False)
    terms: Terms | None = field(default=None, compare=False, repr=False)
    weight_dtype: str = "auto"  # the spec.weights.dtype it is planned (and its profile chosen) in
    pool: str | None = None  # the node pool of its slot (gpus.yaml pools:), None on a fixed node or when refused

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class Pending:
    """A model that waits for a profile on a GPU product: a profiler Job is needed."""

    name: str
    namespace: str
    model: str
    gpu_product: str
    revision: str
    reason: str
    reason_code: str = "AwaitingProfile"
    weight_dtype: str = "auto"  # the spec.weights.dtype the profile is needed for
    pool_selector: tuple[str, str] | None = None  # no fixed node has the product: its profiler Job selects a pool's

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class InputError:
    """One bad file or document; the rest still load."""

    file: str
    document: int | None
    path: str
    message: str
    fix: str
    reason: str = "InvalidSpec"
    object: str | None = None  # namespace/name when known


@dataclass(frozen=True)
class Inputs:
    """Everything a pass reads, already parsed and validated."""

    models: tuple[ElasticModel, ...] = ()
    profiles: tuple[Profile, ...] = ()
    slots: tuple[GpuSlot, ...] = ()
    errors: tuple[InputError, ...] = ()
    pools: tuple[Pool, ...] = ()
    # cluster mode: how many nodes of each pool exist now (their labels say so); offline: not known (empty)
    pool_nodes: tuple[tuple[str, int], ...] = ()
    # gpus.yaml pricePerGpuHour: a price changes a plan only where it picks the pool that adds a node
    prices: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Plan:
    """The planner's output: one decision per planned model, the models awaiting a profile, and the GPUs of
    every pool node the plan keeps (those it places a model on, and each pool's minNodes)."""

    decisions: tuple[Decision, ...] = ()
    pending: tuple[Pending, ...] = ()
    pool_slots: tuple[GpuSlot, ...] = ()
