"""Daily use on a small terminal (#48): tables that fit 80, 100 and 140 columns
with ids, names and statuses whole, ids shown by their shortest start that tells
the rows apart, the dashboard URL on one line, help without ``<bool>``, and the
smaller things a user reads (``print(job.status)``, YAML errors with the file
and line).

The tables are rendered as the CLI renders them, on a rich console of the given
width; the commands that need a server are in test_cli_nouns.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

from raylane.client.tables import ID_MIN_CHARS, Col, print_table, unique_prefixes
from raylane.orchestrator.domain.states import AttemptStatus, JobStatus
from tests.conftest import ROOT

# Array members are made in the same millisecond: their ids share 10 characters and more.
MEMBERS = ["01m8nc9yc43ngmberwcabhxq4y", "01m8nc9yc43ngmberwcabhxq5z", "01m8nc9yc4zzqdaj4vja1rxeem",
           "01m8nc9xj4knhq7tg4yck20jk3"]
NAMES = ["lr-sweep-member-0001", "lr-sweep-member-0002", "finetune-llama-7b", "hello"]
REASON = "waiting for 2 GPUs in node group gpu (project quota reached; 3 jobs ahead of it in the queue)"
LS_COLS = [Col("ID"), Col("NAME"), Col("KIND", cut=2), Col("STATUS"), Col("GROUP", cut=1), Col("CREATED"),
           Col("REASON", cut=0, min_width=12)]


def rendered(width: int) -> list[str]:
    rows = [[i, n, "training", "SUCCEEDED", "spot-cpu", "10s ago", REASON]
            for i, n in zip(unique_prefixes(MEMBERS), NAMES)]
    con = Console(width=width, no_color=True, highlight=False, record=True, file=open(os.devnull, "w"))
    print_table(con, LS_COLS, rows)
    return [line.rstrip() for line in con.export_text().splitlines()]


def test_ids_are_cut_to_the_shortest_start_that_tells_the_rows_apart():
    ids = unique_prefixes(MEMBERS)
    assert ids[0] == "01m8nc9yc43ngmberwcabhxq4" and ids[1] == "01m8nc9yc43ngmberwcabhxq5"
    assert ids[3] == MEMBERS[3][:ID_MIN_CHARS]  # nothing else starts like it: the floor
    for i, x in enumerate(ids):
        assert [m for m in MEMBERS if m.startswith(x)] == [MEMBERS[i]]
    assert unique_prefixes([MEMBERS[0]]) == [MEMBERS[0][:ID_MIN_CHARS]]


@pytest.mark.parametrize("width", [80, 100, 140])
def test_the_jobs_table_fits_with_ids_names_and_statuses_whole(width):
    lines = rendered(width)
    assert all(len(line) <= width for line in lines), "\n".join(lines)
    header = lines[0].split()
    assert header[:2] == ["ID", "NAME"] and "STATUS" in header
    for line, full, name in zip(lines[1:], MEMBERS, NAMES):
        shown = line.split()[0]
        assert full.startswith(shown) and [m for m in MEMBERS if m.startswith(shown)] == [full]
        assert f"  {name}  " in line and "SUCCEEDED" in line


def test_reason_is_cut_first_then_group_then_kind():
    wide, mid, narrow = rendered(140), rendered(100), rendered(80)
    assert "REASON" in wide[0] and "…" in wide[1]  # cut, not wrapped: one line per job
    assert len(wide) == len(mid) == len(narrow) == 1 + len(MEMBERS)
    # 100: no room for 12 characters of reason, so it goes; the group stays whole.
    assert "REASON" not in mid[0] and "GROUP" in mid[0] and "spot-cpu" in mid[1]
    assert "GROUP" not in narrow[0] and "KIND" in narrow[0] and "training" in narrow[1]
    tiny = rendered(60)  # what cannot fit is printed whole, never cut
    assert "REASON" not in tiny[0] and "GROUP" not in tiny[0] and "KIND" not in tiny[0]
    assert "finetune-llama-7b" in tiny[3] and "SUCCEEDED" in tiny[3]


def test_status_prints_its_value():
    assert str(JobStatus.PENDING) == "PENDING" and f"{JobStatus.SUCCEEDED}" == "SUCCEEDED"
    assert str(AttemptStatus.LOST) == "LOST"
    out = subprocess.run([sys.executable, "-c", "from raylane import JobStatus; print(JobStatus.PENDING)"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "PENDING", out.stderr


def test_help_shows_flags_without_a_type():
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
    for args in (["--help"], ["run", "--help"], ["submit", "--help"]):
        r = subprocess.run([sys.executable, "-m", "raylane.client.cli", *args], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=60)
        assert r.returncode == 0 and "<bool>" not in r.stdout, r.stdout
        assert "--help" in r.stdout
    assert re.search(r"--url\s+<str>", subprocess.run(
        [sys.executable, "-m", "raylane.client.cli", "--help"], capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=60).stdout)


def test_a_yaml_error_names_the_file_and_line(tmp_path):
    from raylane.client.sdk import ValidationFailed, spec_body

    bad = tmp_path / "job.yaml"
    bad.write_text("name: x\nkind: command\nentrypoint: [python,\n  resources: {\n")
    with pytest.raises(ValidationFailed) as e:
        spec_body(bad)
    msg = str(e.value)
    assert msg.startswith(f"{bad}, line ") and "<unicode string>" not in msg and "not valid YAML" in msg
    assert msg.count(str(bad)) == 1
