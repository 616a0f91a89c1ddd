"""envpool_loader: only the family a run needs is imported, and nothing is lost by it.

Each case runs in a fresh interpreter: what the loader does depends on what is already imported.
"""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import ROOT


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_atari_id_loads_without_every_family():
    got = _run(
        "import json, sys\n"
        "from fastrl.envs.envpool_loader import load_envpool\n"
        "ep = load_envpool('Pong-v5')\n"
        "e = ep.make('Pong-v5', env_type='gymnasium', num_envs=2, batch_size=2, num_threads=1)\n"
        "obs, _ = e.reset()\n"
        "print(json.dumps({'shape': list(obs.shape), 'n': len(ep.list_all_envs()),"
        " 'matplotlib': 'matplotlib' in sys.modules, 'jumanji': 'envpool.jumanji' in sys.modules}))\n")
    assert got["shape"] == [2, 4, 84, 84]
    assert not got["matplotlib"] and not got["jumanji"]
    everything = _run("import json, envpool\nprint(json.dumps({'n': len(envpool.list_all_envs())}))")
    assert 0 < got["n"] < everything["n"]


def test_unknown_id_ends_with_every_family_and_full_import_still_works():
    got = _run(
        "import json\n"
        "from fastrl.envs.envpool_loader import load_envpool\n"
        "from fastrl.envs.spec import envpool_ids\n"
        "partial = len(envpool_ids('CartPole-v1'))\n"
        "full = sorted(load_envpool('NoSuchEnv-v0').list_all_envs())\n"
        "import envpool.entry\n"
        "print(json.dumps({'partial': partial, 'full': full, 'same_module': load_envpool() is envpool}))\n")
    reference = _run("import json, envpool\nprint(json.dumps({'full': sorted(envpool.list_all_envs())}))")
    assert got["full"] == reference["full"]
    assert got["partial"] < len(reference["full"])
    assert got["same_module"]


def test_envpool_imported_first_is_used_as_is():
    got = _run(
        "import json, envpool\n"
        "from fastrl.envs.envpool_loader import load_envpool\n"
        "print(json.dumps({'same': load_envpool('Pong-v5') is envpool, 'n': len(envpool.list_all_envs())}))\n")
    reference = _run("import json, envpool\nprint(json.dumps({'n': len(envpool.list_all_envs())}))")
    assert got["same"] and got["n"] == reference["n"]
