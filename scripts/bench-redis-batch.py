#!/usr/bin/env python3
"""What one batched check costs redis-server, counted in instructions, without tollgate around it.

Loads this checkout's Lua library (crates/tollgate-redis/scripts, assembled in the order
script.rs gives) into a private redis-server run under valgrind's callgrind, replays a fixed,
seeded series of batches of one-item checks through the batched function (the arguments as
script.rs `fast_command` packs them), and prints the instructions redis-server executed per
check, with the commands the checks ran. The times are explicit and advance a fixed step per
check, so two runs of one checkout count the same instructions whatever the machine is doing:
use it to compare two versions of the scripts (`--src` of each).

Only the measured batches are counted (the warm-up runs uninstrumented). The keys get a long
TTL grace, so that they do not expire on the wall clock while the simulated one runs slower.

Usage: scripts/bench-redis-batch.py [--src DIR] [--keys 10000] [--batch 14] [--batches 2000]
                                    [--warm 5000] [--algorithm sliding_window_counter]
                                    [--step-us 37] [--no-callgrind]
--no-callgrind runs a plain redis-server and only checks that every batch succeeds.
"""
import argparse
import glob
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

ALGORITHMS = {"fixed_window": 4, "sliding_window_counter": 6}
MORE, LAST = 16, 32


def library(src):
    """The library FUNCTION LOAD takes, as script.rs `library` builds it (under the name tgb)."""
    rs = open(os.path.join(src, "crates/tollgate-redis/src/script.rs")).read()
    body = rs[rs.index("macro_rules! lua_body"):]
    body = body[: body.index("};")]
    files = re.findall(r'include_str!\("\.\./scripts/([a-z_]+\.lua)"\)', body)
    if not files:
        sys.exit("bench-redis-batch: no Lua files found in script.rs")
    d = os.path.join(src, "crates/tollgate-redis/scripts")
    code = "".join(open(os.path.join(d, f)).read() for f in files)
    code += open(os.path.join(d, "fast.lua")).read()
    return ("#!lua name=tgb\n" + code + "redis.register_function('tgb', check)\n"
            "redis.register_function('tgb_fast', fast_many)\n")


class Conn:
    def __init__(self, port):
        deadline = time.time() + 60
        while True:
            try:
                self.s = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("bench-redis-batch: redis-server did not start")
                time.sleep(0.1)
        self.f = self.s.makefile("rb")

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a.encode() if isinstance(a, str) else a
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.s.sendall(b"".join(out))
        return self.read()

    def read(self):
        line = self.f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+" or kind == b":":
            return rest
        if kind == b"-":
            return RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        sys.exit(f"bench-redis-batch: unexpected reply {line!r}")


def batch(rng, keys, size, alg, now):
    """The FCALL arguments of one batch: its distinct keys, and the packed requests."""
    picks = rng.sample(range(keys), size) if size <= keys else [rng.randrange(keys) for _ in range(size)]
    order, place, last, flags = [], {}, {}, [0] * size
    for i, k in enumerate(picks):
        if k in place:
            flags[last[k]] = MORE
            flags[i] = LAST
        else:
            order.append(k)
            place[k] = len(order)
        last[k] = i
    packed = struct.pack("<dd", now, 3_600_000)
    for i, k in enumerate(picks):
        # cost 1, a limit no check reaches, one-second windows (unit 0, multiplier 1)
        packed += struct.pack("<ddddBBH", 1, 1e9, 1e6, 1, 0, alg | flags[i], place[k])
    return ["user_%d" % k for k in order], packed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=14)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--warm", type=int, default=5000)
    ap.add_argument("--algorithm", choices=ALGORITHMS, default="sliding_window_counter")
    ap.add_argument("--step-us", type=float, default=37.0)
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--no-callgrind", action="store_true")
    o = ap.parse_args()
    if not shutil.which(o.redis_server):
        sys.exit(f"bench-redis-batch: needs {o.redis_server}")
    callgrind = not o.no_callgrind
    if callgrind and not shutil.which("valgrind"):
        sys.exit("bench-redis-batch: needs valgrind (or --no-callgrind)")
    lib = library(o.src)
    tmp = tempfile.mkdtemp(prefix="tollgate-batch-cost.")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cmd = [o.redis_server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no"]
    if callgrind:
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={tmp}/cg.out"] + cmd
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        c = Conn(port)
        r = c.call("FUNCTION", "LOAD", "REPLACE", lib)
        if r != b"tgb":
            sys.exit(f"bench-redis-batch: FUNCTION LOAD failed: {r}")
        rng = random.Random(7)
        alg = ALGORITHMS[o.algorithm]
        now = 1_800_000_000_000_000.0

        def run(n):
            nonlocal now
            for _ in range(n):
                keys, packed = batch(rng, o.keys, o.batch, alg, now)
                r = c.call("FCALL", "tgb_fast", str(len(keys)), *keys, packed)
                if not isinstance(r, bytes) or len(r) != 8 * (1 + 4 * o.batch):
                    sys.exit(f"bench-redis-batch: a batch failed: {r!r}")
                # every check admitted (the limit is out of reach), none failed
                answers = struct.unpack("<%dd" % (1 + 4 * o.batch), r)
                if any(a != 1 for a in answers[1::4]):
                    sys.exit(f"bench-redis-batch: a check was not admitted: {answers!r}")
                now += o.step_us * o.batch

        run(o.warm)
        if callgrind:
            subprocess.run(["callgrind_control", "-i", "on", str(server.pid)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c.call("CONFIG", "RESETSTAT")
        run(o.batches)
        stats = c.call("INFO", "commandstats").decode()
        if callgrind:
            subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        checks = o.batches * o.batch
        calls = {}
        for line in stats.splitlines():
            if line.startswith("cmdstat_"):
                name, rest = line[8:].split(":", 1)
                if name not in ("info", "config|resetstat"):
                    calls[name] = int(rest.split("calls=")[1].split(",")[0])
        per = ", ".join(f"{k} {v / checks:.3f}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1]))
        line = f"{o.algorithm}, {o.keys} keys, batches of {o.batch}: calls per check: {per}"
        if callgrind:
            dumps = sorted(glob.glob(f"{tmp}/cg.out.*"), key=os.path.getmtime)
            if not dumps:
                sys.exit("bench-redis-batch: callgrind wrote no dump")
            total = next(int(l.split()[1]) for l in open(dumps[-1])
                         if l.startswith(("summary:", "totals:")))
            line = f"{total / checks:,.0f} redis-server instructions per check; " + line
        print(line)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
