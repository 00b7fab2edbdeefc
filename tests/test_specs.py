"""The job spec: DESIGN.md's examples load as written; the impossible is refused
with a message naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from raylane.orchestrator.domain.specs import JobKind, JobSpec, SpecLoadError, load_spec_document

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_design_examples_load_as_written():
    hello = JobSpec.from_file(EXAMPLES / "hello.yaml")
    assert hello.kind is JobKind.COMMAND and hello.entrypoint == "python -c 'print(42)'"
    ft = JobSpec.from_file(EXAMPLES / "finetune.yaml")
    assert ft.resources.num_workers == 2 and ft.resources.gpus_per_worker == 1
    assert ft.placement.colocate is True and ft.priority == 80 and ft.timeout_s == 3600
    sw = JobSpec.from_file(EXAMPLES / "lr-sweep.yaml")
    assert sw.sweep.search_space["lr"].loguniform == [1e-5, 1e-2]
    assert sw.sweep.search_space["batch_size"].choice == [16, 32, 64]
    assert sw.sweep.scheduler == "asha" and sw.retry.max_attempts == 3


def test_json_and_yaml_give_the_same_spec():
    y = JobSpec.from_file(EXAMPLES / "lr-sweep.yaml")
    j = JobSpec.from_yaml(json.dumps(y.model_dump(mode="json")))
    assert j == y


def _errors(data) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as ei:
        JobSpec.model_validate(data)
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in ei.value.errors()]


BASE = {"name": "x", "kind": "command", "entrypoint": "true"}


@pytest.mark.parametrize(
    "patch, field, words",
    [
        ({"resources": {"gpus_per_worker": -1}}, "resources.gpus_per_worker", "greater than or equal to 0"),
        ({"kind": "quantum"}, "kind", "training"),
        ({"name": "n" * 10_000_000}, "name", "at most 128"),
        ({"name": "bad name!"}, "name", "letters"),
        ({"kind": "sweep", "entrypoint": "m:f"}, "", "sweep"),
        ({"kind": "sweep", "entrypoint": "m:f", "sweep": {"metric": "loss", "search_space": {}}},
         "sweep.search_space", "at least 1"),
        ({"kind": "sweep", "entrypoint": "m:f", "sweep": {"metric": "l", "search_space": {"lr": {"loguniform": [0, 1]}}}},
         "sweep.search_space.lr", "low > 0"),
        ({"kind": "sweep", "entrypoint": "m:f", "sweep": {"metric": "l", "search_space": {"lr": {"uniform": [1, 0]}}}},
         "sweep.search_space.lr", "low < high"),
        ({"kind": "training", "entrypoint": "python train.py"}, "", "import path"),
        ({"labels": {f"k{i}": "v" for i in range(100)}}, "labels", "at most 64"),
        ({"resources": {"gpus_per_worker": 1.5}}, "resources.gpus_per_worker", "whole number"),
        ({"priority": 101}, "priority", "less than or equal to 100"),
        ({"colour": "red"}, "colour", "Extra inputs"),
        ({"runtime_env": {"env_vars": {"1BAD": "x"}}}, "runtime_env.env_vars", "environment variable"),
        ({"batch": {"input_uri": "a", "output_uri": "b"}}, "", "batch"),
    ],
)
def test_impossible_specs_name_the_field(patch, field, words):
    errs = _errors({**BASE, **patch})
    assert any(loc == field and words in msg for loc, msg in errs) or any(
        field == "" and words in msg for _, msg in errs
    ), errs


def test_yaml_bomb_is_refused_before_expansion():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    prev = "a"
    for i in range(1, 9):
        bomb += f"{chr(97 + i)}: &{chr(97 + i)} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
        prev = chr(97 + i)
    with pytest.raises(SpecLoadError, match="alias bomb"):
        load_spec_document(bomb)


@pytest.mark.parametrize("text, words", [("", "empty"), ("- a\n- b", "mapping"), ("a: [", "not valid YAML")])
def test_bad_documents(text, words):
    with pytest.raises(SpecLoadError, match=words):
        load_spec_document(text)


def test_a_stored_spec_loads_though_the_input_rule_refuses_it_at_submit():
    """Rows stored before the input rule (a NUL in an env value, deep args) must
    still list and run: the rule guards submit, not the database."""
    deep: dict = {}
    node = deep
    for _ in range(40):
        node["x"] = {}
        node = node["x"]
    row = {"name": "old", "kind": "command", "entrypoint": "true",
           "runtime_env": {"env_vars": {"A": "a\x00b"}}, "args": deep}
    with pytest.raises(ValidationError) as e:
        JobSpec.model_validate(row)
    assert "NUL" in str(e.value)
    spec = JobSpec.from_stored(row)
    assert spec.runtime_env.env_vars["A"] == "a\x00b"


def test_a_spec_short_enough_to_skip_measuring_always_fits():
    """``check_exec_size`` does not measure a spec under ``_ALWAYS_FITS`` characters:
    the worst character there is must still fit that many times over."""
    from raylane.orchestrator.domain.specs import _ALWAYS_FITS, MAX_SPEC_BYTES, check_exec_size, exec_size

    for worst in ("\U0001F600", "\x01", "\u2028", '"'):
        assert len(json.dumps(worst * _ALWAYS_FITS)) <= MAX_SPEC_BYTES
    # A spec just over the bound is measured: one that does not fit is refused.
    big = JobSpec(name="x", kind="command", entrypoint="\U0001F600" * (_ALWAYS_FITS + 10))
    assert len(big.model_dump_json(exclude_none=True)) > _ALWAYS_FITS and exec_size(big) > MAX_SPEC_BYTES
    with pytest.raises(ValueError, match="driver's command line"):
        check_exec_size(big)


def test_default_sections_are_shared_and_cannot_be_changed():
    """Resources, placement and retry defaults are one instance for every spec (not built per
    spec): only sound because nobody can change them through one spec."""
    a = JobSpec(name="a", kind="command", entrypoint="true")
    b = JobSpec(name="b", kind="command", entrypoint="true")
    assert a.resources is b.resources and a.retry is b.retry and a.placement is b.placement
    for section, name, value in ((a.resources, "num_workers", 2), (a.retry, "max_attempts", 9),
                                 (a.placement, "node_group", "gpu")):
        with pytest.raises(ValidationError, match="frozen"):
            setattr(section, name, value)
    assert b.resources.num_workers == 1 and b.retry.max_attempts == 3 and b.placement.node_group == "auto"
    assert a.runtime_env is not b.runtime_env  # holds lists and dicts: one each
