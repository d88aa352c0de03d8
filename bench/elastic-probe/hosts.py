"""Create / delete the two namespace "hosts" with the project's own helper (tests/multirank/netns.py, imported
by path, unmodified). usage: python hosts.py up|down   (state kept in /tmp/elastic_probe/hosts/state.json)"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("netns", "/work/main/tests/multirank/netns.py")
netns = importlib.util.module_from_spec(spec)
sys.modules["netns"] = netns  # dataclasses needs the module registered
spec.loader.exec_module(netns)
work = Path("/tmp/elastic_probe/hosts")
work.mkdir(exist_ok=True)
state = work / "state.json"
if sys.argv[1] == "up":
    print("unavailable:", netns.unavailable())
    two = netns.make_two_hosts(work)
    state.write_text(json.dumps({"namespaces": two.namespaces, "agent": two.agent}))
    print(json.dumps({"namespaces": two.namespaces, "agent": two.agent}))
    print(Path(two.agent).read_text())
else:
    s = json.loads(state.read_text())
    netns.TwoHosts(s["namespaces"], s["agent"]).close()
    print("deleted", s["namespaces"])
print(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout)
