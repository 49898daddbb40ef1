"""Scratch (2026-12-06, run from the repo root; see README.md here): served plain vs dspark-k0 under 16 streaming users; CPU seconds per process
and py-spy collapsed stacks of engine core and worker over a window."""
import asyncio, json, os, subprocess, sys, threading, time, argparse
from pathlib import Path
HERE = Path(__file__).resolve().parent
sys.path.insert(0, "/work/main")
from benchmarks.serving_sweep import _server, configs, prompt_set, one_length_schedule
from benchmarks.load import closed_loop
from dspark_vllm.serving import BUNDLED_DRAFTER
from dspark_vllm.target import prepare_target

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
names = sys.argv[2].split(",")
spy = len(sys.argv) > 3 and sys.argv[3] == "spy"
args = argparse.Namespace(concurrency=[16], prefix_caching=False, executor=None, ledger=True,
                          eager=False, dtype="bfloat16")
cfg = configs(str(BUNDLED_DRAFTER), "", (2,), None)
target = str(prepare_target())
TD = out / "timers"; TD.mkdir(exist_ok=True)
if os.environ.get("SPY_SITE"): os.environ["SPY_TIMERS"] = str(TD); os.environ["PYTHONPATH"] = str(HERE)
def timers(ps):
    res = {}
    for k, p in ps.items():
        f = TD / f"{p}.json"
        if f.is_file():
            try: res[k] = json.loads(f.read_text())["timers"]
            except ValueError: time.sleep(0.2); res[k] = json.loads(f.read_text())["timers"]
    return res
def _base(n): return n.split("@")[0].split("#")[0].split("+")[0]
servers = {n: _server(target, _base(n), cfg[_base(n)], out, args, instance=names.index(n)) for n in names}
for n, s in servers.items():
    if "@" in n: s.env["SPY_MODE"] = n.split("@")[1].split("+")[0]
    if "+stack" in n: s.env["DSPARK_FRAME_STACK"] = n.split("+stack")[1][0]
    if "+wt" in n: s.env["PYTHONPATH"] = "/tmp/wt"
    if "+pymalloc" in n: s.env.update(PYTHONMALLOC="malloc")
    if "malloc" in n: s.env.update(MALLOC_MMAP_THRESHOLD_="33554432", MALLOC_TRIM_THRESHOLD_="1073741824")
for s in servers.values(): s.launch()
def ready(s):
    import urllib.request
    while True:
        try:
            urllib.request.urlopen(s.url + "/health", timeout=2); return
        except Exception: time.sleep(3)
for s in servers.values(): ready(s)
print("ready", flush=True)
prompts = prompt_set(48)
USERS = int(os.environ.get("SPY_USERS", "16"))
def procs(pid):
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    res = {"api": int(pid)}
    for k in kids:
        cmd = open(f"/proc/{k}/cmdline").read()
        comm = open(f"/proc/{k}/comm").read().strip()
        res[comm] = int(k)
        for g in subprocess.run(["pgrep", "-P", k], capture_output=True, text=True).stdout.split():
            res[open(f"/proc/{g}/comm").read().strip()] = int(g)
    return res
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
try:
    for rnd in range(int(os.environ.get('SPY_ROUNDS', '2'))):
        for n, s in servers.items():
            ps = procs(s.proc.pid)
            result = {}
            def load():
                result["r"] = asyncio.run(closed_loop(s.url, prompts, USERS, int(os.environ.get("SPY_REQUESTS", "130")), 128, warmup=USERS))
            th = threading.Thread(target=load); th.start()
            time.sleep(15)
            c0 = {k: cpu(p) for k, p in ps.items()}; t0 = time.time(); T0 = timers(ps)
            spies = []
            if spy and rnd == int(os.environ.get("SPY_AT_ROUND", "1")):
                for k in ps:
                    if k != "api":
                        spies.append(subprocess.Popen([os.environ.get("PY_SPY", "py-spy"), "record", "-p", str(ps[k]),
                            "--rate", "50", *(["--native"] if os.environ.get("SPY_NATIVE") else ["--nonblocking"]), "--format", "raw", "--duration", "30",
                            "-o", str(out / f"{n}-{k.replace(':','_')}.txt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(30)
            time.sleep(1.1); c1 = {k: cpu(p) for k, p in ps.items()}; t1 = time.time(); T1 = timers(ps)
            for p in spies: p.wait()
            th.join()
            res, window, full = result["r"]
            toks = sum(r.tokens for r in res) if hasattr(res[0], "tokens") else None
            print(json.dumps({"round": rnd, "name": n, "window_s": round(window, 1),
                  "full_tok_s": full, "cpu_share": {k: round((c1[k]-c0[k])/(t1-t0), 2) for k in c0}}), flush=True)
            if "adaptive" in n:
                import urllib.request
                try:
                    st = urllib.request.urlopen(s.url + "/dspark/status", timeout=5).read().decode()
                    (out / f"status-{n}-{rnd}.json").write_text(st)
                except Exception as e: print("status", n, e, flush=True)
            for proc in T1:
                d = {lab: (v[0] - T0.get(proc, {}).get(lab, [0, 0])[0], v[1] - T0.get(proc, {}).get(lab, [0, 0])[1]) for lab, v in T1[proc].items()}
                print("   ", proc, json.dumps({lab: [round(a / n * 1e3, 2) if n else 0, n] for lab, (a, n) in sorted(d.items())}), flush=True)
finally:
    for s in servers.values():
        try: os.killpg(s.proc.pid, 15)
        except Exception: pass
