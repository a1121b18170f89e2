"""emit_all: which artefacts each plan gets, overwrite refusal, atomic writes, modes, plan.json round trip."""

from __future__ import annotations

import fnmatch
import json
import os
import stat
from importlib import resources
from pathlib import Path

import pytest
from emit_cases import CASES

from autotune.catalog import load_model, make_cluster
from autotune.emit import ARTEFACT_FILES, emit_all, read_plan_document
from autotune.errors import ConfigError
from autotune.plan import FP8_RECIPES, ParallelPlan

ALWAYS = {
    "plan.json",
    "trial/plan.json",
    "trial/trial.json",
    "torchrun_args.txt",
    "autotune_env.sh",
    "launch_torchrun.sh",
    "launch_slurm.sbatch",
    "pytorchjob.yaml",
    "summary.md",
}
DS = {"ds_config.json", "launch_deepspeed.sh"}
EXPECTED = {  # the frameworks that can run each plan as priced
    "zero0": DS | {"torchtitan.toml", "megatron_args.txt"},
    "zero1": DS | {"megatron_args.txt"},
    "zero2": DS,
    "zero3": DS,
    "ds_pipeline": DS | {"megatron_args.txt"},
    "ds_ulysses": DS,
    "autotp": DS,
    "fsdp_full": DS | {"accelerate_fsdp.yaml", "torchtitan.toml"},
    "hsdp": {"accelerate_fsdp.yaml", "torchtitan.toml"},
    "fsdp_grad_op_cp_fp8": {"accelerate_fsdp.yaml", "torchtitan.toml"},
    "megatron_interleaved": {"megatron_args.txt"},
    "gpt_megatron": {"torchtitan.toml", "megatron_args.txt"},
    "mixtral_megatron": {"megatron_args.txt"},
    "deepseek_v3_megatron": {"megatron_args.txt"},
    "qwen3_moe_fsdp_ep": {"torchtitan.toml"},
    "qwen3_megatron_tokendrop": {"megatron_args.txt"},
    "mixtral_megatron_allgather": {"megatron_args.txt"},
    "qwen3_megatron_a2a_overlap": {"megatron_args.txt"},
    "qwen3_megatron_offload_experts": {"megatron_args.txt"},
    "deepseek_v3_mtp_megatron": {"megatron_args.txt"},
    "gdn_megatron": {"megatron_args.txt"},
    "nemotron_megatron": {"megatron_args.txt"},
    "super_megatron_kv_replicas": {"megatron_args.txt"},
}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("name", list(CASES))
def test_each_plan_gets_the_artefacts_that_can_express_it(name, emitted):
    assert _files(emitted(name)) == ALWAYS | EXPECTED[name]


def test_skipped_artefacts_are_explained_in_the_summary(emitted):
    summary = (emitted("megatron_interleaved") / "summary.md").read_text()
    assert "## Not emitted" in summary
    assert "`ds_config.json`, `launch_deepspeed.sh`: AutoTP does not split norms/dropout" in summary
    assert "`accelerate_fsdp.yaml`: FSDP has no zero1" in summary
    assert "`torchtitan.toml`: FSDP2 has no zero1" in summary
    assert "Priced for **megatron**: start with megatron_args.txt" in summary


def test_the_summary_says_what_accelerates_wrapping_adds_to_the_estimate(emitted):
    """accelerate's transformer-based wrap leaves the embeddings and head in the root FSDP unit; the estimate
    prices them as their own units (torchtitan, the trials), so the summary names the difference."""
    summary = (emitted("fsdp_full") / "summary.md").read_text()
    assert "stay in the root FSDP unit" in summary and "GiB above the estimate" in summary
    assert "root FSDP unit" not in (emitted("megatron_interleaved") / "summary.md").read_text()


def test_the_summary_lists_the_memory_options_the_args_set(emitted):
    summary = (emitted("qwen3_megatron_offload_experts") / "summary.md").read_text()
    assert "| recompute modules | moe_act layernorm |" in summary
    assert "| activation offload (modules) | expert_fc1 moe_act |" in summary
    assert "activation offload" not in (emitted("megatron_interleaved") / "summary.md").read_text()


def _emit(name: str, out: Path, **kwargs):
    plan, model, cluster = CASES[name].build()
    return emit_all(plan, model, cluster, kwargs.pop("estimate", None), out, **kwargs)


def test_refuses_to_overwrite_without_force(tmp_path):
    _emit("zero0", tmp_path)
    (tmp_path / "ds_config.json").write_text("edited by hand\n")
    with pytest.raises(ConfigError, match=r"plan.json already exists; pass --force"):
        _emit("zero0", tmp_path)
    assert (tmp_path / "ds_config.json").read_text() == "edited by hand\n"  # nothing touched
    _emit("zero0", tmp_path, force=True)
    assert json.loads((tmp_path / "ds_config.json").read_text())["train_batch_size"] == 64


def test_any_owned_file_blocks_a_write(tmp_path):
    (tmp_path / "trial").mkdir()
    (tmp_path / "trial" / "trial.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"trial/trial.json already exists"):
        _emit("zero0", tmp_path)
    assert _files(tmp_path) == {"trial/trial.json"}


def test_force_removes_files_an_earlier_plan_left(tmp_path):
    _emit("zero0", tmp_path)
    _emit("hsdp", tmp_path, force=True)
    assert _files(tmp_path) == ALWAYS | EXPECTED["hsdp"]  # no stale ds_config.json or megatron_args.txt


def test_writes_are_atomic_and_modes_are_set(tmp_path):
    paths = _emit("fsdp_full", tmp_path)
    assert {str(p.relative_to(tmp_path)) for p in paths} == _files(tmp_path)  # no temporary files left
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        launcher = path.suffix in (".sh", ".sbatch") and path.name != "autotune_env.sh"  # that one is sourced
        assert mode == (0o755 if launcher else 0o644), path


def test_illegal_plan_writes_nothing(tmp_path):
    plan, model, _ = CASES["zero0"].build()
    with pytest.raises(ConfigError, match="does not equal the 16 GPUs"):
        emit_all(plan, model, make_cluster(num_gpus=16), None, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_out_must_be_a_directory(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        _emit("zero0", tmp_path / "file")


def test_plan_json_round_trips(emitted):
    plan, model, cluster = CASES["megatron_interleaved"].build()
    doc = read_plan_document(emitted("megatron_interleaved") / "plan.json")
    assert doc.plan == plan and doc.model == model
    assert (doc.cluster.num_nodes, doc.cluster.gpus_per_node, doc.cluster.gpu.key) == (8, 8, "h100-sxm")
    assert (doc.cluster.intra_link, doc.cluster.inter_link) == (cluster.intra_link, cluster.inter_link)
    gpt = read_plan_document(emitted("gpt_megatron") / "plan.json").model
    assert gpt == CASES["gpt_megatron"].build()[1]  # learned positions, biases, tied embeddings survive


def test_estimate_is_recorded_and_summarised(tmp_path):
    estimate = {
        "feasible": False,
        "reasons": ["out of memory: needs 90 GiB"],
        "memory_bytes_per_gpu": 90 * 2**30,
        "memory_capacity_bytes": 80 * 2**30,
        "step_time_s": 1.5,
        "tokens_per_s": 1e5,
        "mfu": 0.41,
        "bottleneck": "memory",
    }
    _emit("zero0", tmp_path, estimate=estimate)
    assert read_plan_document(tmp_path / "plan.json").estimate == estimate
    summary = (tmp_path / "summary.md").read_text()
    assert "feasible: no" in summary and "out of memory" in summary and "90.0 GiB of 80.0 GiB" in summary


def test_trial_dir_is_what_the_worker_reads(emitted):
    trial = emitted("hsdp") / "trial"
    plan = ParallelPlan.from_dict(json.loads((trial / "plan.json").read_text()))
    assert plan == CASES["hsdp"].build()[0]
    config = pytest.importorskip("autotune.trials.config")
    assert config.TrialConfig.read(trial / "trial.json").model == CASES["hsdp"].build()[1]


def test_templates_ship_as_package_data():
    root = Path(__file__).resolve().parents[2]
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = setuptools["package-data"]["autotune"]
    templates = resources.files("autotune.emit").joinpath("templates")
    names = [t.name for t in templates.iterdir() if t.name.endswith(".tmpl")]
    assert len(names) == 5
    for name in names:
        assert any(fnmatch.fnmatch(f"emit/templates/{name}", g) for g in globs), name


def test_artefact_list_is_complete():
    assert set(ARTEFACT_FILES) == ALWAYS | {f for files in EXPECTED.values() for f in files}
    assert not any(os.path.isabs(f) for f in ARTEFACT_FILES)


def test_a_plan_deepspeed_cannot_run_is_never_priced():
    """DeepSpeed AutoTP has no sequence parallelism: the plan rules reject it, so no search prices it."""
    with pytest.raises(ConfigError, match="no Megatron-style sequence parallelism"):
        ParallelPlan(
            tp=2,
            dp=4,
            global_batch=64,
            seq_len=4096,
            sharding="zero2",
            sequence_parallel=True,
            framework="deepspeed",
        )


@pytest.mark.parametrize("name", list(CASES))
def test_no_file_names_the_folder_it_was_emitted_into(name, emitted):
    """Relocatable: planning happens on a laptop, ``best/`` is copied to the cluster."""
    out = emitted(name)
    for path in out.rglob("*"):
        if path.is_file():
            assert str(out) not in path.read_text(), path.name


@pytest.mark.parametrize(
    ("framework", "recipe"),
    [(fw, r) for fw, recipes in FP8_RECIPES.items() for r in sorted(recipes)],
)
@pytest.mark.parametrize("layout", [{"tp": 8, "sharding": "none"}, {"dp": 8, "sharding": "fsdp-full"}])
def test_every_fp8_recipe_is_written_as_itself_or_not_written(framework, recipe, layout, tmp_path):
    """An fp8 plan of one framework is emitted for the others too: each file either runs the plan's recipe or
    is left out with the reason (a rowwise plan once crashed the Megatron emitter; a delayed one got
    ``recipe_name = "delayed"``, which torchao does not know; accelerate's AO backend scales tensorwise)."""
    plan = ParallelPlan(
        global_batch=64, seq_len=8192, framework=framework, precision="fp8", fp8_recipe=recipe, **layout
    )
    emit_all(plan, load_model("llama3-8b"), make_cluster(num_gpus=8, gpu="b200"), None, tmp_path)
    written = {p.name: p.read_text() for p in tmp_path.iterdir() if p.is_file()}
    summary = written["summary.md"]
    runs = {fw: {str(r) for r in recipes} for fw, recipes in FP8_RECIPES.items()}
    expected = {  # what each file says for the recipe; None: it has no such recipe and must be left out
        "megatron_args.txt": f"--fp8-recipe {'mxfp8' if recipe == 'mx' else recipe}",
        "torchtitan.toml": {"tensorwise": "enable_fsdp_float8_all_gather", "mx": '"mxfp8_cublas"'}.get(
            recipe, f'recipe_name = "{recipe}"'
        ),
        "accelerate_fsdp.yaml": "backend: AO" if recipe == "tensorwise" else None,
    }
    for name, fw in (("megatron_args.txt", "megatron"), ("torchtitan.toml", "fsdp")):
        if recipe not in runs[fw]:
            expected[name] = None
    for name, marker in expected.items():
        if name in written:
            assert marker and marker in written[name], (name, written[name])
        elif marker is not None and name == {"fsdp": "torchtitan.toml", "megatron": "megatron_args.txt"}.get(
            framework
        ):
            pytest.fail(f"{name} not written for its own framework's {recipe} plan")
        else:
            assert f"`{name}`" in summary, name  # left out, with the reason
