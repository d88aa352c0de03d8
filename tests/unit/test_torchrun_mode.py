"""hvdliterun's torchrun mode in process: which backends it routes to hvdlite, the PYTHONPATH that
starts it (and that its children get), and what the launcher gives the ranks. The mode itself,
with real ranks: tests/multirank/test_torchrun_mode.py."""

import os

import pytest
from hvdlite.runner.cli import LaunchError, prepare

from hvdlite.settings.config import ConfigError, load_config
from hvdlite.torch.distributed.torchrun import routed
from hvdlite.utils.bootstrap import TORCH_BOOTSTRAP_DIR, with_bootstrap, without_bootstrap


@pytest.mark.parametrize(("asked", "runs"), [
    ("gloo", "hvdlite"), ("nccl", "hvdlite"), ("NCCL", "hvdlite"), ("mpi", "hvdlite"), ("hvdlite", "hvdlite"),
    ("cpu:gloo,cuda:nccl", "hvdlite"), ("cpu:gloo", "hvdlite"), (None, None), ("ucc", "ucc"),
    ("cpu:gloo,cuda:ucc", "cpu:gloo,cuda:ucc"),  # one device hvdlite does not stand for: torch decides
])
def test_the_mode_routes_the_backends_hvdlite_stands_for(asked, runs) -> None:
    assert routed(asked) == runs


def test_bootstrap_leads_the_path_once_and_children_lose_it() -> None:
    assert os.path.isfile(os.path.join(TORCH_BOOTSTRAP_DIR, "sitecustomize.py"))
    assert os.listdir(TORCH_BOOTSTRAP_DIR) in (["sitecustomize.py"], ["sitecustomize.py", "__pycache__"],
                                               ["__pycache__", "sitecustomize.py"])  # nothing else importable
    led = with_bootstrap(os.pathsep.join(["/a", TORCH_BOOTSTRAP_DIR, "/b"]))
    assert led.split(os.pathsep) == [TORCH_BOOTSTRAP_DIR, "/a", "/b"]
    assert with_bootstrap("") == TORCH_BOOTSTRAP_DIR
    assert without_bootstrap(led) == os.pathsep.join(["/a", "/b"]) and without_bootstrap(with_bootstrap("")) == ""


def test_launcher_gives_ranks_the_bootstrap_and_forwards_it_to_other_hosts() -> None:
    spec, env, _ = prepare(["-np", "2", "-H", "a:1,b:1", "--env-forward", "none", "--torch-backend", "hvdlite",
                            "python", "x.py"], {"PYTHONPATH": "/mine"})
    assert env["PYTHONPATH"].split(os.pathsep) == [TORCH_BOOTSTRAP_DIR, "/mine"]
    assert env["HVDLITE_TORCH_BACKEND"] == "hvdlite" and "PYTHONPATH" in spec.env_forward
    _, plain, _ = prepare(["-np", "2", "python", "x.py"], {"PYTHONPATH": "/mine"})
    assert plain["PYTHONPATH"] == "/mine"


def test_an_unknown_torch_backend_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="HVDLITE_TORCH_BACKEND"):
        load_config({"HVDLITE_TORCH_BACKEND": "gloo"})
    with pytest.raises(LaunchError, match="TORCH_BACKEND"):
        prepare(["-np", "2", "--torch-backend", "nccl", "python", "x.py"], {})
