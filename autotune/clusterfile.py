"""A cluster YAML (``--cluster FILE``): ``gpu`` (a catalog name or a GPU described inline), ``num_nodes``,
``gpus_per_node``, optional links, NICs and host memory.

Its own module because an inline GPU is ``autotune.usergpu``'s, which builds on the catalog: the catalog
stays below both.
"""

from __future__ import annotations

from pathlib import Path

from autotune.catalog import _MAX_HOST_MEMORY_GIB as MAX_HOST_MEMORY_GIB
from autotune.catalog import _int_field as int_field
from autotune.catalog import gpu_names, link_names, make_cluster, read_mapping
from autotune.errors import ConfigError
from autotune.specs import ClusterSpec
from autotune.usergpu import gpu_from_mapping

__all__ = ["load_cluster"]

_CLUSTER_KEYS = {
    "gpu",
    "num_nodes",
    "gpus_per_node",
    "intra_node_link",
    "inter_node_link",
    "nics_per_node",
    "host_memory_gib",
    "name",
    "nvlink_domain_gpus",
}


def load_cluster(path: str | Path) -> ClusterSpec:
    """The cluster a YAML file describes (module docstring)."""
    where = str(path)
    cfg = read_mapping(Path(path))
    unknown = sorted(set(cfg) - _CLUSTER_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}'; allowed: {', '.join(sorted(_CLUSTER_KEYS))}")
    gpu = cfg.get("gpu")
    if isinstance(gpu, dict):  # a GPU described inline (usergpu)
        gpu = gpu_from_mapping(gpu, where=where)
    elif not isinstance(gpu, str):
        raise ConfigError(
            f"{where}: missing key 'gpu' (one of {', '.join(gpu_names())}, or a mapping of GPU keys)"
        )
    nodes = int_field(cfg, "num_nodes", where)
    per_node = int_field(cfg, "gpus_per_node", where)
    host = cfg.get("host_memory_gib")
    if host is not None and (
        isinstance(host, bool) or not isinstance(host, (int, float)) or not 0 < host <= MAX_HOST_MEMORY_GIB
    ):  # also rejects nan and inf
        raise ConfigError(
            f"{where}: key 'host_memory_gib' must be a number in (0, {MAX_HOST_MEMORY_GIB}], got {host!r}"
        )
    for key in ("intra_node_link", "inter_node_link"):
        if key in cfg and not isinstance(cfg[key], str):
            raise ConfigError(f"{where}: key '{key}' must be a link name ({', '.join(link_names())})")
    nics = cfg.get("nics_per_node")
    if nics is not None:
        nics = int_field(cfg, "nics_per_node", where)
    domain = cfg.get("nvlink_domain_gpus")
    if domain is not None:
        domain = int_field(cfg, "nvlink_domain_gpus", where)
    return make_cluster(
        num_gpus=nodes * per_node,
        gpu=gpu,
        gpus_per_node=per_node,
        intra_node=cfg.get("intra_node_link"),
        inter_node=cfg.get("inter_node_link"),
        nics_per_node=nics,
        host_memory_gib=host,
        nvlink_domain_gpus=domain,
    )
