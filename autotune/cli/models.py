"""``autotune models``: the model presets ``--model`` takes, with what autotune reads from each."""

from __future__ import annotations

import argparse
import json

from autotune.catalog import load_model, model_names, preset_config, unknown_model
from autotune.render import model_info, params_line

__all__ = ["ModelsCommand"]


class ModelsCommand:
    help = "List the model presets --model takes: parameters, layers, experts and each one's source."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("names", nargs="*", metavar="NAME", help="only these presets (default: all)")
        p.add_argument("--json", action="store_true", help="print one JSON list (model_info per preset)")

    def run(self, args: argparse.Namespace) -> int:
        names = args.names or model_names()
        unknown = [name for name in names if name not in model_names()]
        if unknown:
            raise unknown_model(unknown[0], field="NAME")
        models = [load_model(name) for name in names]
        if args.json:
            rows = [{**model_info(m), "source": preset_config(m.name).get("source")} for m in models]
            print(json.dumps(rows, indent=2))
            return 0
        width = max(len(m.name) for m in models)
        for m in models:
            experts = f", {m.num_experts} experts top-{m.experts_per_token}" if m.is_moe else ""
            shape = f"{m.num_layers} layers x {m.hidden_size}{experts}, {m.max_seq_len:,} positions"
            print(f"{m.name:<{width}}  {params_line(m)}; {shape}")
            print(f"{'':<{width}}  {preset_config(m.name).get('source', '')}")
        return 0
